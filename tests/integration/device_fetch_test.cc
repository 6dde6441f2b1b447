// Same-node engines fetching into their own device memory (proto/strata/v1/device.proto)
// against a real stratad whose GPU tier is host memory standing in for the device, and engine
// buffers that are shared memory standing in for theirs (strata/device_buffer.h): blocks land
// where the engine said, from the GPU tier or host memory; loans are their tenant's, bounded,
// and gone once returned; bad handles and a daemon without a GPU tier get clear errors.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>

#if STRATA_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common/crc32c.h"
#include "storage/gpu/device_memory.h"
#include "strata/device_buffer.h"
#include "strata/v1/device.grpc.pb.h"
#include "tests/integration/auth_fixture.h"
#include "tests/integration/device_fixture.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT(build/namespaces): the shared fixture of these tests

using namespace device_fixture;  // NOLINT(build/namespaces)
constexpr size_t kBlock = 512 << 10;

uint64_t Counter(const DaemonStats& s, const std::string& name) {
  for (const auto& [k, v] : s.counters)
    if (k == name) return v;
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

struct Published {
  NamespaceId ns;
  std::vector<BlockId> ids;
  std::vector<std::vector<uint8_t>> blocks;
};

Published PublishBlocks(Client& c, const std::string& tenant, size_t n, uint32_t seed) {
  Published p;
  auto ns = c.OpenNamespace(Spec(), tenant);
  EXPECT_TRUE(ns.ok()) << ns.status();
  if (!ns.ok()) return p;
  p.ns = *ns;
  p.blocks = testing::RandomBlocks(n, kBlock, seed);
  std::vector<ConstBuffer> views;
  for (const auto& b : p.blocks) views.push_back({b.data(), b.size()});
  auto pub = c.Publish(p.ns, testing::Tokens(n * kTokensPerBlock, seed), views);
  EXPECT_TRUE(pub.ok()) << pub.status();
  if (pub.ok()) p.ids = pub->ids;
  return p;
}

TEST(DeviceFetchTest, BlocksLandInTheEnginesBufferFromTheGpuTierOrHostMemory) {
  DaemonProcess d(std::string("host_tier:\n  capacity: 64MiB\n") + kGpu);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  Published p = PublishBlocks(*client, "t", 10, 5);
  ASSERT_EQ(p.ids.size(), 10u);
  auto moved = client->Reposition(p.ns, {p.ids.data(), 2}, "", false, "gpu");
  ASSERT_TRUE(moved.ok()) << moved.status();

  auto buffer = StandInDeviceBuffer::Create(16 * kBlock);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto loan = client->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan.ok()) << loan.status();
  const uint8_t* mem = (*buffer)->data();

  // Blocks 0-1 are on the GPU tier, 2-3 only in host memory: promoted on the way.
  std::vector<BlockId> ids = {p.ids[3], p.ids[0], p.ids[2], p.ids[1]};
  std::vector<uint64_t> offsets = {0, 3 * kBlock, 5 * kBlock, 9 * kBlock};
  const auto called = std::chrono::steady_clock::now();
  auto f = client->FetchToDevice(p.ns, *loan, ids, offsets);
  const auto call_us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - called).count();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 4u);
  // The daemon's share of the call (promotions and copies) is part of the call's time.
  EXPECT_LE(f->daemon_micros, static_cast<uint64_t>(call_us));
  EXPECT_EQ(f->bytes, 4 * kBlock);
  EXPECT_EQ(f->sources, std::vector<std::string>(4, "gpu"));
  const int order[] = {3, 0, 2, 1};
  for (size_t k = 0; k < 4; ++k) {
    const auto& want = p.blocks[order[k]];
    EXPECT_EQ(std::memcmp(mem + offsets[k], want.data(), kBlock), 0) << "block " << order[k];
    EXPECT_EQ(f->crcs[k], Crc32c(want.data(), kBlock));
  }
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Counter(*stats, "gpu_peer_fetches_device_only_total"), 0u) << "2 needed promoting";

  // All four on the device now: the daemon's data plane answers the fetch as a message, with
  // device-to-device copies alone, the same blocks landing at the new offsets.
  const std::vector<uint64_t> again = {10 * kBlock, 11 * kBlock, 12 * kBlock, 13 * kBlock};
  f = client->FetchToDevice(p.ns, *loan, ids, again);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 4u);
  EXPECT_EQ(f->sources, std::vector<std::string>(4, "gpu"));
  for (size_t k = 0; k < 4; ++k)
    EXPECT_EQ(std::memcmp(mem + again[k], p.blocks[order[k]].data(), kBlock), 0) << k;
  stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Counter(*stats, "gpu_peer_fetches_device_only_total"), 1u);

  // Without promotion: from host memory; unknown ids and blocks past the range say so alone.
  BlockId unknown = p.ids[0];
  unknown.bytes[0] ^= 1;
  ids = {p.ids[6], unknown, p.ids[7]};
  offsets = {kBlock, 2 * kBlock, 16 * kBlock - 100};
  f = client->FetchToDevice(p.ns, *loan, ids, offsets, {.promote = false});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->status, (std::vector<BlockStatus>{BlockStatus::kOk, BlockStatus::kNotFound,
                                                 BlockStatus::kInvalid}));
  EXPECT_EQ(f->sources[0], "host");
  EXPECT_EQ(std::memcmp(mem + kBlock, p.blocks[6].data(), kBlock), 0);

  // More than the GPU tier holds (8 blocks of 512 KiB in 4 MiB, 4 of them leased meanwhile
  // would not fit): every block arrives, from wherever it is.
  ids.assign(p.ids.begin(), p.ids.end());
  offsets.clear();
  for (size_t i = 0; i < ids.size(); ++i) offsets.push_back(i * kBlock);
  f = client->FetchToDevice(p.ns, *loan, ids, offsets);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 10u);
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(std::memcmp(mem + i * kBlock, p.blocks[i].data(), kBlock), 0) << "block " << i;
  stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Counter(*stats, "gpu_peer_copies_total"), 19u);
  // Blocks that were not all on the device went through DeviceCopies.
  EXPECT_EQ(Counter(*stats, "gpu_peer_fetches_device_only_total"), 1u);

  // A mismatched request, then the loan returned: gone for good.
  f = client->FetchToDevice(p.ns, *loan, ids, {offsets.data(), 2});
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  ASSERT_TRUE(client->ReturnDeviceBuffer(*loan).ok());
  f = client->FetchToDevice(p.ns, *loan, {ids.data(), 1}, {offsets.data(), 1});
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_EQ(client->ReturnDeviceBuffer(*loan).code(), absl::StatusCode::kNotFound);
}

TEST(DeviceFetchTest, ALoanIsItsTenantsAndLoansAreBounded) {
  auto d = AuthDaemon(kGpu);
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  auto b = ConnectAs(*d, kTokenB);
  ASSERT_TRUE(a && b);
  Published pa = PublishBlocks(*a, "a", 2, 7);
  Published pb = PublishBlocks(*b, "b", 2, 8);
  ASSERT_EQ(pa.ids.size(), 2u);
  ASSERT_EQ(pb.ids.size(), 2u);
  auto buffer = StandInDeviceBuffer::Create(2 * kBlock);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto loan_a = a->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan_a.ok()) << loan_a.status();
  const uint64_t at[] = {0};

  // Tenant b can neither use nor return a's loan (told it does not exist), nor fetch a's blocks.
  auto f = b->FetchToDevice(pb.ns, *loan_a, {pb.ids.data(), 1}, at);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_EQ(b->ReturnDeviceBuffer(*loan_a).code(), absl::StatusCode::kNotFound);
  auto loan_b = b->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan_b.ok()) << loan_b.status();
  f = b->FetchToDevice(pa.ns, *loan_b, {pa.ids.data(), 1}, at);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kPermissionDenied) << f.status();
  f = a->FetchToDevice(pa.ns, *loan_a, {pa.ids.data(), 1}, at);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(std::memcmp((*buffer)->data(), pa.blocks[0].data(), kBlock), 0);

  // No token: no loan.
  auto stub = v1::DeviceCopies::NewStub(Channel(*d));
  v1::LendDeviceBufferRequest req;
  req.set_kind((*buffer)->handle().kind);
  req.set_handle((*buffer)->handle().handle);
  req.set_bytes(kBlock);
  v1::LendDeviceBufferResponse resp;
  EXPECT_EQ(stub->Lend(Ctx("").get(), req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub->Lend(Ctx(kPeerToken).get(), req, &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Tenant a may hold 16 loans; the 17th is refused until one comes back.
  std::vector<uint64_t> more;
  for (int i = 0; i < 15; ++i) {
    auto l = a->LendDeviceBuffer((*buffer)->handle());
    ASSERT_TRUE(l.ok()) << i << ": " << l.status();
    more.push_back(*l);
  }
  auto refused = a->LendDeviceBuffer((*buffer)->handle());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(b->LendDeviceBuffer((*buffer)->handle()).ok()) << "b's loans are b's";
  ASSERT_TRUE(a->ReturnDeviceBuffer(more.back()).ok());
  EXPECT_TRUE(a->LendDeviceBuffer((*buffer)->handle()).ok());
}

TEST(DeviceFetchTest, HandlesTheDaemonCannotOpenAreClearErrors) {
  DaemonProcess d(std::string("host_tier:\n  capacity: 64MiB\n") + kGpu);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  auto buffer = StandInDeviceBuffer::Create(kBlock);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  DeviceBufferHandle h = (*buffer)->handle();

  DeviceBufferHandle bad = h;
  bad.kind = "cuda-ipc";
  auto l = client->LendDeviceBuffer(bad);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l.status();
  EXPECT_NE(l.status().message().find("host-stand-in"), std::string::npos) << l.status();
  bad = h;
  bad.handle = "/etc/passwd";
  EXPECT_EQ(client->LendDeviceBuffer(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = h;
  bad.bytes = 2 * kBlock;
  EXPECT_EQ(client->LendDeviceBuffer(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = h;
  bad.handle.back() = bad.handle.back() == '0' ? '1' : '0';
  EXPECT_EQ(client->LendDeviceBuffer(bad).status().code(), absl::StatusCode::kFailedPrecondition);

  // A lender that shrinks its buffer under the daemon: the copy lands in a longer file, the
  // daemon lives on.
  auto loan = client->LendDeviceBuffer(h);
  ASSERT_TRUE(loan.ok()) << loan.status();
  Published p = PublishBlocks(*client, "t", 1, 9);
  ASSERT_EQ(p.ids.size(), 1u);
  const int fd = shm_open(h.handle.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  const uint64_t at[] = {0};
  auto f = client->FetchToDevice(p.ns, *loan, p.ids, at);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(client->Stats().ok()) << "the daemon is alive";
}

// A namespace with a codec: blocks arrive decoded (the stand-in tier decodes on the CPU; a CUDA
// tier on the device), the same bytes the client's own decoder gives; as stored without decode.
TEST(DeviceFetchTest, CodedBlocksArriveDecodedWhenAsked) {
  DaemonProcess d(std::string("host_tier:\n  capacity: 64MiB\n") + kGpu);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  NamespaceSpec spec = Spec();
  spec.layout = KvLayout{4, 2, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  spec.codec_policy = "quant:k3v3:ol";
  auto ns = client->OpenNamespace(spec, "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const size_t bytes = spec.layout.BlockBytes();
  std::vector<std::vector<uint8_t>> kv;
  for (uint32_t i = 0; i < 3; ++i) kv.push_back(FiniteHalfBlock(bytes, 12345 + i));
  std::vector<ConstBuffer> views;
  for (const auto& b : kv) views.push_back({b.data(), b.size()});
  auto pub = client->Publish(*ns, testing::Tokens(3 * kTokensPerBlock, 21), views);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 3u);
  // What the client's own decoder makes of them.
  std::vector<std::vector<uint8_t>> want(3, std::vector<uint8_t>(bytes));
  std::vector<MutableBuffer> outs;
  for (auto& w : want) outs.push_back({w.data(), w.size()});
  auto fetched = client->Fetch(*ns, pub->ids, outs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->fetched, 3u);

  auto buffer = StandInDeviceBuffer::Create(4 * bytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto loan = client->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan.ok()) << loan.status();
  const std::vector<uint64_t> offsets = {2 * bytes, 0, bytes};
  auto f = client->FetchToDevice(*ns, *loan, pub->ids, offsets, {.decode = true});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 3u);
  EXPECT_EQ(f->sizes, std::vector<uint64_t>(3, bytes));
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(std::memcmp((*buffer)->data() + offsets[i], want[i].data(), bytes), 0) << i;
  // A decoded block past the buffer's end is refused alone.
  const std::vector<uint64_t> late = {3 * bytes + 1};
  f = client->FetchToDevice(*ns, *loan, {pub->ids.data(), 1}, late, {.decode = true});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->status[0], BlockStatus::kInvalid);
  // Without decode: the blobs as stored, smaller than the decoded blocks.
  f = client->FetchToDevice(*ns, *loan, pub->ids, offsets);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 3u);
  EXPECT_LT(f->sizes[0], bytes / 3);
}

TEST(DeviceFetchTest, ADaemonWithoutAGpuTierSaysSo) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  auto buffer = StandInDeviceBuffer::Create(kBlock);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto l = client->LendDeviceBuffer((*buffer)->handle());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << l.status();
  EXPECT_NE(l.status().message().find("no GPU tier"), std::string::npos) << l.status();
}

TEST(DeviceFetchTest, ExportingACudaBufferSaysWhyItCannot) {
  int host_memory = 0;
  auto h = ExportCudaBuffer(&host_memory, sizeof host_memory);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(h.status()) || absl::IsInvalidArgument(h.status()))
      << h.status();
}

// On a GPU node (scripts/device-check.sh): a CUDA GPU tier in stratad, an engine buffer from
// cudaMalloc in this process, lent over CUDA IPC; blocks arrive device to device.
TEST(DeviceFetchTest, ACudaEngineBufferGetsBlocksFromTheDaemonsGpuTier) {
#if !STRATA_TEST_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) GTEST_SKIP() << s.message();
  DaemonProcess d("host_tier:\n  capacity: 64MiB\ngpu:\n  capacity: 16MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  Published p = PublishBlocks(*client, "t", 4, 13);
  ASSERT_EQ(p.ids.size(), 4u);
  ASSERT_TRUE(client->Reposition(p.ns, {p.ids.data(), 2}, "", false, "gpu").ok());
  void* engine = nullptr;
  ASSERT_EQ(cudaMalloc(&engine, 8 * kBlock), cudaSuccess);
  ASSERT_EQ(cudaMemset(engine, 0, 8 * kBlock), cudaSuccess);
  // The lent range starts one block into the allocation.
  auto h = ExportCudaBuffer(static_cast<uint8_t*>(engine) + kBlock, 6 * kBlock);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, "cuda-ipc");
  EXPECT_EQ(h->offset, kBlock);
  auto loan = client->LendDeviceBuffer(*h);
  ASSERT_TRUE(loan.ok()) << loan.status();
  const std::vector<uint64_t> offsets = {3 * kBlock, 0, kBlock, 5 * kBlock};
  auto f = client->FetchToDevice(p.ns, *loan, p.ids, offsets);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 4u);
  EXPECT_EQ(f->sources[0], "gpu");
  std::vector<uint8_t> got(kBlock);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(cudaMemcpy(got.data(), static_cast<uint8_t*>(engine) + kBlock + offsets[i], kBlock,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got, p.blocks[i]) << "block " << i;
  }
  // All four on the device now: copied by the daemon's gather kernel, here to offsets that are
  // not 16-byte aligned (its byte-wise path).
  std::vector<uint64_t> odd;
  for (uint64_t i = 0; i < 4; ++i) odd.push_back(i * kBlock + 2 * i + 1);
  f = client->FetchToDevice(p.ns, *loan, p.ids, odd);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->sources, std::vector<std::string>(4, "gpu"));
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(cudaMemcpy(got.data(), static_cast<uint8_t*>(engine) + kBlock + odd[i], kBlock,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got, p.blocks[i]) << "block " << i << " at an odd offset";
  }
  // A range past the allocation is refused by the daemon, which checks the allocation's size.
  DeviceBufferHandle past = *h;
  past.bytes = 8 * kBlock;
  EXPECT_EQ(client->LendDeviceBuffer(past).status().code(), absl::StatusCode::kInvalidArgument);
  // A coded namespace: decoded on the device by the daemon's CUDA decoder, the client's bytes.
  NamespaceSpec spec = Spec();
  spec.layout = KvLayout{4, 2, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  spec.codec_policy = "quant:k3v3:ol";
  auto cns = client->OpenNamespace(spec, "t");
  ASSERT_TRUE(cns.ok()) << cns.status();
  const size_t bytes = spec.layout.BlockBytes();
  std::vector<uint8_t> kv(bytes);
  for (size_t k = 0; k < bytes; k += 2) {
    const uint16_t h = static_cast<uint16_t>(0x3000 + (k * 2654435761u >> 7) % 0x0C00);
    std::memcpy(kv.data() + k, &h, 2);
  }
  const ConstBuffer view{kv.data(), kv.size()};
  auto pub = client->Publish(*cns, testing::Tokens(kTokensPerBlock, 3), {&view, 1});
  ASSERT_TRUE(pub.ok() && pub->stored == 1) << pub.status();
  std::vector<uint8_t> want(bytes);
  const MutableBuffer out{want.data(), want.size()};
  ASSERT_TRUE(client->Fetch(*cns, pub->ids, {&out, 1}).ok());
  const uint64_t at[] = {0};
  f = client->FetchToDevice(*cns, *loan, pub->ids, at, {.decode = true});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->fetched, 1u);
  std::vector<uint8_t> decoded(bytes);
  ASSERT_EQ(cudaMemcpy(decoded.data(), static_cast<uint8_t*>(engine) + kBlock, bytes,
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(decoded, want);
  ASSERT_TRUE(client->ReturnDeviceBuffer(*loan).ok());
  cudaFree(engine);
#endif
}

}  // namespace
}  // namespace strata
