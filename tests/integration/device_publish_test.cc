// Same-node engines publishing straight out of their own device memory (DeviceCopies
// PublishFromDevice) against a real stratad whose GPU tier is host memory standing in for the
// device, with engine buffers of shared memory standing in for theirs: blocks are stored as a
// host publish would store them (the codec's blob byte for byte under a codec policy), bad
// blocks are refused alone, and the tenant rules hold.
#include <gtest/gtest.h>

#include <cstring>

#if STRATA_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#include "codec/codec.h"
#include "storage/gpu/device_memory.h"
#include "strata/device_buffer.h"
#include "tests/integration/auth_fixture.h"
#include "tests/integration/device_fixture.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT(build/namespaces): the shared fixture of these tests

using namespace device_fixture;  // NOLINT(build/namespaces)

constexpr size_t kBlock = 256 << 10;

TEST(DevicePublishTest, BlocksArePublishedStraightOutOfTheEnginesBuffer) {
  DaemonProcess d(std::string("host_tier:\n  capacity: 64MiB\n") + kGpu);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto ids = client->BlockIds(*ns, testing::Tokens(6 * kTokensPerBlock, 3));
  ASSERT_TRUE(ids.ok() && ids->size() == 6);
  const auto blocks = testing::RandomBlocks(6, kBlock, 9);

  auto buffer = StandInDeviceBuffer::Create(8 * kBlock);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::vector<uint64_t> offsets = {5 * kBlock, 0, 2 * kBlock, 7 * kBlock};
  for (size_t i = 0; i < 4; ++i)
    std::memcpy((*buffer)->data() + offsets[i], blocks[i].data(), kBlock);
  auto loan = client->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan.ok()) << loan.status();

  const std::vector<uint64_t> sizes(4, kBlock);
  std::span<const BlockId> first4(ids->data(), 4);
  std::vector<BlockId> parents = {BlockId{}, (*ids)[0], (*ids)[1], (*ids)[2]};
  auto pub = client->PublishFromDevice(*ns, *loan, first4, parents, offsets, sizes);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->stored, 4u);
  EXPECT_EQ(pub->bytes_read, 4 * kBlock);
  EXPECT_EQ(pub->stored_bytes, std::vector<uint64_t>(4, kBlock));
  EXPECT_FALSE(pub->encoded_on_device);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto counter = [&](const std::string& name) -> uint64_t {
    for (const auto& [k, v] : stats->counters)
      if (k == name) return v;
    ADD_FAILURE() << "no counter " << name;
    return 0;
  };
  EXPECT_EQ(counter("gpu_peer_reads_total"), 4u);
  EXPECT_EQ(counter("gpu_peer_read_bytes_total"), 4 * kBlock);
  EXPECT_EQ(counter("gpu_peer_device_encodes_total"), 0u);

  // Found and fetched like any published block; a second publish finds them there.
  auto found = client->LookupIds(*ns, first4);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 4u);
  std::vector<std::vector<uint8_t>> got(4, std::vector<uint8_t>(kBlock));
  std::vector<MutableBuffer> outs;
  for (auto& g : got) outs.push_back({g.data(), g.size()});
  auto fetched = client->Fetch(*ns, first4, outs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], blocks[i]) << i;
  pub = client->PublishFromDevice(*ns, *loan, first4, parents, offsets, sizes);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->status, std::vector<BlockStatus>(4, BlockStatus::kExists));

  // A block past the lent range (checked before whether it is held) and an empty one are
  // refused alone; the third is stored.
  const std::vector<uint64_t> bad_offsets = {8 * kBlock - 100, kBlock, 2 * kBlock};
  const std::vector<uint64_t> bad_sizes = {kBlock, 0, kBlock};
  std::span<const BlockId> last3(ids->data() + 3, 3);
  pub = client->PublishFromDevice(*ns, *loan, last3, {}, bad_offsets, bad_sizes);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->status, (std::vector<BlockStatus>{BlockStatus::kInvalid, BlockStatus::kInvalid,
                                                   BlockStatus::kOk}));
  EXPECT_EQ(pub->stored_bytes, (std::vector<uint64_t>{0, 0, kBlock}));
  found = client->LookupIds(*ns, {ids->data() + 4, 1});
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 0u) << "the refused block is not stored";

  // Mismatched lists are the caller's error; a returned loan is gone.
  pub = client->PublishFromDevice(*ns, *loan, last3, {}, {bad_offsets.data(), 2}, bad_sizes);
  EXPECT_EQ(pub.status().code(), absl::StatusCode::kInvalidArgument) << pub.status();
  ASSERT_TRUE(client->ReturnDeviceBuffer(*loan).ok());
  pub = client->PublishFromDevice(*ns, *loan, first4, {}, offsets, sizes);
  EXPECT_EQ(pub.status().code(), absl::StatusCode::kNotFound) << pub.status();
}

TEST(DevicePublishTest, TheDaemonEncodesCodedBlocksIntoTheClientLibrarysBlob) {
  DaemonProcess d(std::string("host_tier:\n  capacity: 64MiB\n") + kGpu);
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  for (const char* policy : {"quant:k3v3:ol", "quant:k4v2:had", "int4-g64", "lossless"}) {
    SCOPED_TRACE(policy);
    NamespaceSpec spec = Spec();
    spec.layout = KvLayout{4, 2, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
    spec.codec_policy = policy;
    auto ns = client->OpenNamespace(spec, "t");
    ASSERT_TRUE(ns.ok()) << ns.status();
    const size_t bytes = spec.layout.BlockBytes();
    auto ids = client->BlockIds(*ns, testing::Tokens(4 * kTokensPerBlock, 5));
    ASSERT_TRUE(ids.ok() && ids->size() == 4);
    auto buffer = StandInDeviceBuffer::Create(4 * bytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    std::vector<std::vector<uint8_t>> kv, want;
    auto params = codec::ParseCodecSpec(policy);
    ASSERT_TRUE(params.ok());
    for (uint32_t i = 0; i < 4; ++i) {
      kv.push_back(FiniteHalfBlock(bytes, 100 + i));
      if (i == 2) {  // an infinity: no lossy codec takes it
        const uint16_t inf = 0x7C00;
        std::memcpy(kv[i].data() + 64, &inf, 2);
      }
      std::memcpy((*buffer)->data() + i * bytes, kv[i].data(), bytes);
      auto blob = codec::Encode(spec.layout, *params, kv[i]);
      want.push_back(blob.ok() ? *blob : std::vector<uint8_t>());
    }
    // The client library refuses the infinity under every lossy mode (so must the daemon);
    // lossless takes it.
    const bool lossy = want[2].empty();
    EXPECT_EQ(lossy, std::string(policy) != "lossless");
    auto loan = client->LendDeviceBuffer((*buffer)->handle());
    ASSERT_TRUE(loan.ok()) << loan.status();
    const std::vector<uint64_t> offsets = {0, bytes, 2 * bytes, 3 * bytes};
    std::vector<uint64_t> sizes(4, bytes);
    sizes[3] = bytes - 2;  // not the layout's block
    auto pub = client->PublishFromDevice(*ns, *loan, *ids, {}, offsets, sizes);
    ASSERT_TRUE(pub.ok()) << pub.status();
    EXPECT_EQ(pub->status, (std::vector<BlockStatus>{BlockStatus::kOk, BlockStatus::kOk,
                                                     lossy ? BlockStatus::kInvalid
                                                           : BlockStatus::kOk,
                                                     BlockStatus::kInvalid}));
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(pub->stored_bytes[i], want[i].size()) << i;

    // What is stored is the blob the client library would have published, byte for byte.
    auto back = StandInDeviceBuffer::Create(4 * bytes);
    ASSERT_TRUE(back.ok());
    auto back_loan = client->LendDeviceBuffer((*back)->handle());
    ASSERT_TRUE(back_loan.ok());
    const size_t n = lossy ? 2 : 3;
    auto f = client->FetchToDevice(*ns, *back_loan, {ids->data(), n}, {offsets.data(), n});
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->fetched, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(f->sizes[i], want[i].size());
      EXPECT_EQ(std::memcmp((*back)->data() + offsets[i], want[i].data(), want[i].size()), 0)
          << "block " << i;
    }
  }
  // A pca namespace's blocks need its calibration, which the client library holds.
  NamespaceSpec spec = Spec();
  spec.codec_policy = "pca:b1.5";
  auto ns = client->OpenNamespace(spec, "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto buffer = StandInDeviceBuffer::Create(spec.layout.BlockBytes());
  auto loan = client->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan.ok());
  auto ids = client->BlockIds(*ns, testing::Tokens(kTokensPerBlock, 6));
  const uint64_t zero[] = {0}, size[] = {spec.layout.BlockBytes()};
  auto pub = client->PublishFromDevice(*ns, *loan, *ids, {}, zero, size);
  EXPECT_EQ(pub.status().code(), absl::StatusCode::kFailedPrecondition) << pub.status();
}

TEST(DevicePublishTest, OnlyTheNamespacesTenantPublishesWithItsOwnLoan) {
  auto d = AuthDaemon(kGpu);
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  auto b = ConnectAs(*d, kTokenB);
  ASSERT_TRUE(a && b);
  auto ns_a = a->OpenNamespace(Spec(), "a");
  auto ns_b = b->OpenNamespace(Spec(), "b");
  ASSERT_TRUE(ns_a.ok() && ns_b.ok());
  auto buffer = StandInDeviceBuffer::Create(kBlock);
  ASSERT_TRUE(buffer.ok());
  auto loan_a = a->LendDeviceBuffer((*buffer)->handle());
  auto loan_b = b->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan_a.ok() && loan_b.ok());
  auto ids = a->BlockIds(*ns_a, testing::Tokens(kTokensPerBlock, 8));
  ASSERT_TRUE(ids.ok());
  const uint64_t zero[] = {0}, size[] = {kBlock};
  // b's loan into a's namespace, a's loan by b: refused, nothing stored.
  auto pub = b->PublishFromDevice(*ns_a, *loan_b, *ids, {}, zero, size);
  EXPECT_EQ(pub.status().code(), absl::StatusCode::kPermissionDenied) << pub.status();
  auto ids_b = b->BlockIds(*ns_b, testing::Tokens(kTokensPerBlock, 8));
  ASSERT_TRUE(ids_b.ok());
  pub = b->PublishFromDevice(*ns_b, *loan_a, *ids_b, {}, zero, size);
  EXPECT_EQ(pub.status().code(), absl::StatusCode::kNotFound) << pub.status();
  auto found = a->LookupIds(*ns_a, *ids);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 0u);
  pub = a->PublishFromDevice(*ns_a, *loan_a, *ids, {}, zero, size);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->stored, 1u);
}

// On a GPU node (scripts/device-check.sh): an engine buffer from cudaMalloc in this process, lent
// over CUDA IPC to a stratad with a CUDA GPU tier; blocks of a quant namespace are quantised on
// the device by the daemon's CUDA encoder, and stored as the client library's blob.
TEST(DevicePublishTest, ACudaEngineBufferPublishesBlocksEncodedOnTheDevice) {
#if !STRATA_TEST_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) GTEST_SKIP() << s.message();
  DaemonProcess d("host_tier:\n  capacity: 64MiB\ngpu:\n  capacity: 16MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  NamespaceSpec spec = Spec();
  spec.layout = KvLayout{4, 2, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  for (const char* policy : {"quant:k3v3:ol", "int4-g64", "opaque"}) {
    SCOPED_TRACE(policy);
    spec.codec_policy = policy;
    auto ns = client->OpenNamespace(spec, "t");
    ASSERT_TRUE(ns.ok()) << ns.status();
    const size_t bytes = spec.layout.BlockBytes();
    std::vector<std::vector<uint8_t>> kv = {FiniteHalfBlock(bytes, 7), FiniteHalfBlock(bytes, 8)};
    void* engine = nullptr;
    ASSERT_EQ(cudaMalloc(&engine, 2 * bytes), cudaSuccess);
    for (size_t i = 0; i < 2; ++i)
      ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(engine) + i * bytes, kv[i].data(), bytes,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    auto h = ExportCudaBuffer(engine, 2 * bytes);
    ASSERT_TRUE(h.ok()) << h.status();
    auto loan = client->LendDeviceBuffer(*h);
    ASSERT_TRUE(loan.ok()) << loan.status();
    auto ids = client->BlockIds(*ns, testing::Tokens(2 * kTokensPerBlock, 9));
    ASSERT_TRUE(ids.ok());
    const uint64_t offsets[] = {0, bytes}, sizes[] = {bytes, bytes};
    auto pub = client->PublishFromDevice(*ns, *loan, *ids, {}, offsets, sizes);
    ASSERT_TRUE(pub.ok()) << pub.status();
    EXPECT_EQ(pub->stored, 2u);
    const bool opaque = std::string(policy) == "opaque";
    EXPECT_EQ(pub->encoded_on_device, !opaque);
    // Fetched back into the engine's buffer as stored (no decode): the CPU encoder's blob, or
    // the bytes themselves.
    for (size_t i = 0; i < 2; ++i) {
      std::vector<uint8_t> want = kv[i];
      if (!opaque) {
        auto blob = codec::Encode(spec.layout, *codec::ParseCodecSpec(policy), kv[i]);
        ASSERT_TRUE(blob.ok());
        want = *blob;
      }
      EXPECT_EQ(pub->stored_bytes[i], want.size()) << i;
      const uint64_t at[] = {0};
      auto f = client->FetchToDevice(*ns, *loan, {ids->data() + i, 1}, at);
      ASSERT_TRUE(f.ok()) << f.status();
      ASSERT_EQ(f->sizes[0], want.size());
      std::vector<uint8_t> got(want.size());
      ASSERT_EQ(cudaMemcpy(got.data(), engine, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, want) << "block " << i;
    }
    ASSERT_TRUE(client->ReturnDeviceBuffer(*loan).ok());
    cudaFree(engine);
  }
#endif
}

}  // namespace
}  // namespace strata
