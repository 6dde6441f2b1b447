// The GPU tier and the CUDA codec on a device, with cudaMemcpy of the same bytes measured in the
// same run as the baseline (issue 17's lines):
//   fetch    a device lease on promoted blocks and a device-to-device copy of each into an
//            engine buffer, vs cudaMemcpy device-to-device of the same blocks;
//   promote  blocks copied up from the host arena through the tier, vs cudaMemcpy host-to-device
//            from pinned memory;
//   codec    group-wise int4 (g64) encode and decode of fp16 KV on the device, GB/s of fp16;
//            whole blocks (quant:k4v4:had) encoded from device memory by the DeviceEncoder
//            (kernels on the device, rANS on the CPU) vs the CPU Encoder on the same block.
// Medians of --reps repetitions. --json PATH writes the figures; --smoke runs tiny sizes.
// Without a CUDA device it prints why and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "codec/codec.h"
#include "codec/cuda/device_codec.h"
#include "codec/cuda/device_encoder.h"
#include "codec/synthetic_kv.h"
#include "common/crc32c.h"
#include "common/units.h"
#include "storage/arena.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "storage/host_block_store.h"

namespace strata {
namespace {

struct Args {
  uint64_t block_bytes = 8 << 20;
  size_t blocks = 64;
  int reps = 5;
  std::string json;
  bool smoke = false;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename F>
double MedianGbps(int reps, uint64_t bytes, F run) {
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    if (!run()) return 0;
    gbps.push_back(static_cast<double>(bytes) / Seconds(t0) / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

int Run(const Args& a) {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) {
    std::printf("gpu_bench: skipped: %s\n", std::string(s.message()).c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const uint64_t total = a.block_bytes * a.blocks;
  std::printf("gpu_bench: %s, %zu blocks of %s (%s), %d reps\n", prop.name, a.blocks,
              FormatSize(a.block_bytes).c_str(), FormatSize(total).c_str(), a.reps);
  cudaStream_t stream;
  if (!Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream")) return 1;

  // Baselines: cudaMemcpy of the same blocks, device to device and pinned host to device.
  void *d_src = nullptr, *d_dst = nullptr, *h_pinned = nullptr;
  if (!Check(cudaMalloc(&d_src, total), "cudaMalloc") ||
      !Check(cudaMalloc(&d_dst, total), "cudaMalloc") ||
      !Check(cudaMallocHost(&h_pinned, total), "cudaMallocHost"))
    return 1;
  cudaMemset(d_src, 7, total);
  std::memset(h_pinned, 9, total);
  auto copy_blocks = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    for (size_t i = 0; i < a.blocks; ++i)
      cudaMemcpyAsync(static_cast<uint8_t*>(dst) + i * a.block_bytes,
                      static_cast<const uint8_t*>(src) + i * a.block_bytes, a.block_bytes, kind,
                      stream);
    return Check(cudaStreamSynchronize(stream), "copy");
  };
  copy_blocks(d_dst, d_src, cudaMemcpyDeviceToDevice);  // warm-up
  const double d2d = MedianGbps(a.reps, total, [&] {
    return copy_blocks(d_dst, d_src, cudaMemcpyDeviceToDevice);
  });
  const double h2d = MedianGbps(a.reps, total, [&] {
    return copy_blocks(d_dst, h_pinned, cudaMemcpyHostToDevice);
  });

  // The tier: host arena below, device pool above.
  auto arena = MmapArena::Create(total + total / 4, false);
  if (!arena.ok()) return std::fprintf(stderr, "%s\n", arena.status().ToString().c_str()), 1;
  HostTier host((*arena)->data(), (*arena)->size());
  HostBlockStore below(&host);
  auto memory = OpenCudaDeviceMemory(0, total + total / 8);
  if (!memory.ok()) return std::fprintf(stderr, "%s\n", memory.status().ToString().c_str()), 1;
  auto store = GpuTieredStore::Open(&below, std::move(*memory), {});
  if (!store.ok()) return std::fprintf(stderr, "%s\n", store.status().ToString().c_str()), 1;
  GpuTieredStore& tier = **store;
  const NamespaceId ns = ComputeBlockId(Digest{}, std::vector<uint32_t>{4242});
  std::vector<BlockId> ids;
  for (uint32_t i = 0; i < a.blocks; ++i) {
    ids.push_back(ComputeBlockId(Digest{}, std::vector<uint32_t>{i}));
    ReserveItem item{ids.back(), {}, a.block_bytes};
    ReserveResult r = tier.Reserve(ns, {&item, 1});
    if (r.status[0] != BlockStatus::kOk) return std::fprintf(stderr, "reserve failed\n"), 1;
    uint8_t* p = tier.arena_base() + r.offsets[0];
    std::memset(p, static_cast<int>(i), a.block_bytes);
    const uint32_t crc = Crc32c(p, a.block_bytes);
    if (!tier.Commit(r.reservation_id, {&crc, 1}).ok()) return 1;
  }
  // Promotion: the device copies are dropped between repetitions (untimed), so every one
  // copies all blocks up.
  std::vector<double> promote_runs;
  for (int r = 0; r < a.reps; ++r) {
    (void)tier.DropFromDevice(ns, ids);
    auto t0 = std::chrono::steady_clock::now();
    auto st = tier.Promote(ns, ids);
    const double s = Seconds(t0);
    if (!std::all_of(st.begin(), st.end(), [](BlockStatus b) { return b == BlockStatus::kOk; }))
      return std::fprintf(stderr, "promotion failed\n"), 1;
    promote_runs.push_back(static_cast<double>(total) / s / 1e9);
  }
  std::sort(promote_runs.begin(), promote_runs.end());
  const double promote = promote_runs[promote_runs.size() / 2];
  uint8_t* pool = reinterpret_cast<uint8_t*>(tier.memory().device_address());
  const double fetch = MedianGbps(a.reps, total, [&] {
    AcquireResult l = tier.AcquireOnDevice(ns, ids);
    if (l.lease_id == 0) return false;
    for (size_t i = 0; i < ids.size(); ++i)
      cudaMemcpyAsync(static_cast<uint8_t*>(d_dst) + i * a.block_bytes, pool + l.offsets[i],
                      l.sizes[i], cudaMemcpyDeviceToDevice, stream);
    bool ok = Check(cudaStreamSynchronize(stream), "fetch copy");
    return tier.ReleaseOnDevice(l.lease_id).ok() && ok;
  });
  const GpuTierCounters c = tier.Counters();

  // The CUDA codec: int4, groups of 64, on fp16 values already on the device.
  const size_t values = total / 2;
  const size_t payload = codec::cuda::GroupwisePayloadBytes(values, 4, 64);
  void* d_payload = nullptr;
  if (!Check(cudaMalloc(&d_payload, payload), "cudaMalloc payload")) return 1;
  std::vector<uint16_t> half(values);
  for (size_t k = 0; k < values; ++k) half[k] = static_cast<uint16_t>(0x3000 + (k * 2654435761u >> 20) % 0x0C00);
  cudaMemcpy(d_src, half.data(), total, cudaMemcpyHostToDevice);
  auto enc = [&] {
    auto s = codec::cuda::GroupwiseEncode(d_src, DType::kFloat16, values, 4, 64,
                                          static_cast<uint8_t*>(d_payload), stream);
    return s.ok() && codec::cuda::Synchronize(stream).ok();
  };
  auto dec = [&] {
    auto s = codec::cuda::GroupwiseDecode(static_cast<uint8_t*>(d_payload), payload,
                                          DType::kFloat16, values, 4, 64, d_dst, stream);
    return s.ok() && codec::cuda::Synchronize(stream).ok();
  };
  enc();
  dec();
  const double encode = MedianGbps(a.reps, total, enc);
  const double decode = MedianGbps(a.reps, total, dec);

  // Whole blocks of a quant namespace, encoded where they lie (the blob is the CPU's).
  const KvLayout kv{.num_layers = 4, .num_kv_heads = 8, .head_dim = 128,
                    .dtype = DType::kFloat16, .tokens_per_block = 64};
  if (kv.BlockBytes() > total) return std::fprintf(stderr, "blocks too small for a KV block\n"), 1;
  const std::vector<uint8_t> kv_block = codec::GenerateSyntheticKv(kv, 1);
  const codec::CodecParams qp = *codec::ParseCodecSpec("quant:k4v4:had");
  cudaMemcpy(d_src, kv_block.data(), kv_block.size(), cudaMemcpyHostToDevice);
  codec::cuda::DeviceEncoder device_encoder;
  codec::Encoder cpu_encoder;
  std::vector<uint8_t> blob_dev, blob_cpu;
  const int block_reps = a.smoke ? 2 : 20;
  auto qenc_dev = [&] {
    for (int i = 0; i < block_reps; ++i)
      if (!device_encoder.Encode(kv, qp, d_src, kv_block.size(), &blob_dev).ok()) return false;
    return true;
  };
  auto qenc_cpu = [&] {
    for (int i = 0; i < block_reps; ++i)
      if (!cpu_encoder.Encode(kv, qp, kv_block, &blob_cpu).ok()) return false;
    return true;
  };
  qenc_dev();
  qenc_cpu();
  const uint64_t qbytes = kv_block.size() * block_reps;
  const double qdev = MedianGbps(a.reps, qbytes, qenc_dev);
  const double qcpu = MedianGbps(a.reps, qbytes, qenc_cpu);
  const bool same_blob = blob_dev == blob_cpu;

  std::printf("baseline   cudaMemcpy d2d %.1f GB/s, h2d (pinned) %.1f GB/s\n", d2d, h2d);
  std::printf("fetch      gpu tier -> engine buffer %.1f GB/s = %.2fx d2d (target >= 0.7)\n",
              fetch, fetch / d2d);
  std::printf("promote    host arena -> gpu tier %.1f GB/s = %.2fx h2d\n", promote, promote / h2d);
  std::printf("codec      int4-g64 encode %.1f GB/s, decode %.1f GB/s (target decode >= 100)\n",
              encode, decode);
  std::printf("codec      quant:k4v4:had block encode from device memory %.2f GB/s, CPU encoder "
              "%.2f GB/s (%.2fx), blob %s the CPU's\n",
              qdev, qcpu, qdev / qcpu, same_blob ? "equal to" : "DIFFERENT from");
  std::printf("tier       promotions %llu, victims held below %llu, dropped %llu, copy errors "
              "%llu\n",
              static_cast<unsigned long long>(c.promotions),
              static_cast<unsigned long long>(c.victims_held_below),
              static_cast<unsigned long long>(c.victims_dropped),
              static_cast<unsigned long long>(c.copy_errors));
  if (!a.json.empty()) {
    std::ofstream(a.json) << absl::StrFormat(
        "{\"device\":\"%s\",\"block_bytes\":%d,\"blocks\":%d,\"d2d_gbps\":%.3f,\"h2d_gbps\":%.3f,"
        "\"fetch_gbps\":%.3f,\"fetch_vs_d2d\":%.3f,\"promote_gbps\":%.3f,\"promote_vs_h2d\":%.3f,"
        "\"codec_encode_gbps\":%.3f,\"codec_decode_gbps\":%.3f,\"quant_device_encode_gbps\":%.3f,"
        "\"quant_cpu_encode_gbps\":%.3f,\"quant_device_blob_equal\":%s}\n",
        prop.name, a.block_bytes, a.blocks, d2d, h2d, fetch, fetch / d2d, promote,
        promote / h2d, encode, decode, qdev, qcpu, same_blob ? "true" : "false");
  }
  tier.Stop();
  cudaFree(d_payload);
  cudaFree(d_src);
  cudaFree(d_dst);
  cudaFreeHost(h_pinned);
  cudaStreamDestroy(stream);
  const bool pass = fetch >= 0.7 * d2d && decode >= 100 && c.copy_errors == 0 && same_blob;
  std::printf("gpu_bench: %s\n", pass ? "targets met" : "targets NOT met");
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--smoke") {
      a.smoke = true;
      a.block_bytes = 1 << 20;
      a.blocks = 4;
      a.reps = 1;
    } else if (arg == "--block-bytes") {
      a.block_bytes = std::stoull(next());
    } else if (arg == "--blocks") {
      a.blocks = std::stoul(next());
    } else if (arg == "--reps") {
      a.reps = std::max(1, std::stoi(next()));
    } else if (arg == "--json") {
      a.json = next();
    } else {
      std::fprintf(stderr, "usage: gpu_bench [--smoke] [--block-bytes N] [--blocks N] "
                           "[--reps N] [--json PATH]\n");
      return 2;
    }
  }
  return strata::Run(a);
}
