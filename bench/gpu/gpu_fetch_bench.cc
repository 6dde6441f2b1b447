// Same-node engines fetching blocks into their own device memory through stratad (issue 17 item
// 2): a real stratad with a CUDA GPU tier, blocks published and repositioned into that tier, an
// engine buffer from cudaMalloc lent once with ExportCudaBuffer (CUDA IPC), and FetchToDevice
// timed end to end (the gRPC call, the daemon's device-to-device copies into the IPC-opened
// buffer) against cudaMemcpy device-to-device of the same bytes in this process, in the same
// run. Blocks only host memory holds (promote=false) are timed against pinned host-to-device.
// Then the other direction: PublishFromDevice out of the same buffer (opaque, and a quant
// namespace the daemon encodes on the device) against a copy down and a Publish from host memory.
// Medians of --reps. Without a CUDA device it says why and exits 0.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/common/bench_util.h"
#include "strata/client.h"
#include "strata/device_buffer.h"

namespace {

using strata::bench::Clock;

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

double Median(std::vector<double> v) { return strata::bench::Percentile(std::move(v), 0.5); }

template <typename F>
double MedianGbps(int reps, uint64_t bytes, F run) {
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    if (!run()) return 0;
    gbps.push_back(static_cast<double>(bytes) / strata::bench::Seconds(Clock::now() - t0) / 1e9);
  }
  return Median(std::move(gbps));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU-tier fetch into an engine's device buffer vs cudaMemcpy"};
  std::string stratad = STRATAD_BIN, json;
  uint64_t block_bytes = 8 << 20;
  size_t blocks = 32;
  int reps = 5;
  bool smoke = false;
  app.add_option("--stratad", stratad);
  app.add_option("--block-bytes", block_bytes);
  app.add_option("--blocks", blocks);
  app.add_option("--reps", reps);
  app.add_option("--json", json);
  app.add_flag("--smoke", smoke);
  CLI11_PARSE(app, argc, argv);
  if (smoke) block_bytes = 1 << 20, blocks = 4, reps = 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_fetch_bench: skipped: no CUDA device is visible\n");
    return 0;
  }
  const uint64_t total = block_bytes * blocks;
  std::string tmp =
      (std::filesystem::temp_directory_path() / "strata-gpu-fetch-bench-XXXXXX").string();
  if (!mkdtemp(tmp.data())) return std::perror("mkdtemp"), 1;
  std::ofstream(tmp + "/config.yaml") << "gpu:\n  capacity: " << total + total / 4
                                      << "\n  high_watermark: 1.0\n  low_watermark: 1.0\n";
  strata::bench::StratadProcess daemon(
      stratad,
      {"--config", tmp + "/config.yaml", "--data-dir", tmp + "/data", "--host-capacity",
       std::to_string(total * 3), "--log-level", "warn"},
      tmp, "");
  if (daemon.endpoint().empty()) {
    std::fprintf(stderr, "stratad did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  strata::ClientOptions o;
  o.endpoint = daemon.endpoint();
  auto client = strata::Client::Connect(o);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  strata::NamespaceSpec spec;
  spec.model_id = "gpu-fetch-bench";
  spec.layout = strata::KvLayout{1, 1, 64, strata::DType::kFloat16, 16,
                                 strata::KvKind::kSeparateKV};
  auto ns = (*client)->OpenNamespace(spec, "bench");
  if (!ns.ok()) return std::fprintf(stderr, "%s\n", ns.status().ToString().c_str()), 1;
  std::vector<std::vector<uint8_t>> data(blocks, std::vector<uint8_t>(block_bytes));
  std::vector<strata::ConstBuffer> views;
  for (size_t i = 0; i < blocks; ++i) {
    std::fill(data[i].begin(), data[i].end(), static_cast<uint8_t>(i + 1));
    views.push_back({data[i].data(), data[i].size()});
  }
  std::vector<uint32_t> tokens(blocks * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i);
  auto pub = (*client)->Publish(*ns, tokens, views);
  if (!pub.ok() || pub->stored != blocks)
    return std::fprintf(stderr, "publish failed: %s\n", pub.status().ToString().c_str()), 1;
  const std::vector<strata::BlockId>& ids = pub->ids;
  // The same bytes under other ids, left in host memory: the host-to-device fetches.
  for (uint32_t& t : tokens) t += static_cast<uint32_t>(tokens.size());
  auto in_host = (*client)->Publish(*ns, tokens, views);
  if (!in_host.ok() || in_host->stored != blocks)
    return std::fprintf(stderr, "publish failed: %s\n", in_host.status().ToString().c_str()), 1;

  void *engine = nullptr, *src = nullptr, *pinned = nullptr;
  cudaStream_t stream;
  if (!Check(cudaMalloc(&engine, total), "cudaMalloc") ||
      !Check(cudaMalloc(&src, total), "cudaMalloc") ||
      !Check(cudaMallocHost(&pinned, total), "cudaMallocHost") ||
      !Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"))
    return 1;
  auto copy = [&](void* dst, const void* from, cudaMemcpyKind kind) {
    for (size_t i = 0; i < blocks; ++i)
      cudaMemcpyAsync(static_cast<uint8_t*>(dst) + i * block_bytes,
                      static_cast<const uint8_t*>(from) + i * block_bytes, block_bytes, kind,
                      stream);
    return Check(cudaStreamSynchronize(stream), "copy");
  };
  copy(engine, src, cudaMemcpyDeviceToDevice);
  const double d2d = MedianGbps(reps, total, [&] {
    return copy(engine, src, cudaMemcpyDeviceToDevice);
  });
  const double h2d = MedianGbps(reps, total, [&] {
    return copy(engine, pinned, cudaMemcpyHostToDevice);
  });

  auto handle = strata::ExportCudaBuffer(engine, total);
  if (!handle.ok()) return std::fprintf(stderr, "%s\n", handle.status().ToString().c_str()), 1;
  auto loan = (*client)->LendDeviceBuffer(*handle);
  if (!loan.ok()) return std::fprintf(stderr, "%s\n", loan.status().ToString().c_str()), 1;
  std::vector<uint64_t> offsets;
  for (size_t i = 0; i < blocks; ++i) offsets.push_back(i * block_bytes);
  bool all_from_gpu = true, all_from_host = true, bytes_ok = true;
  std::vector<double> daemon_us;  // the daemon's share of each whole fetch
  auto fetch = [&](bool promote) {
    auto f = (*client)->FetchToDevice(*ns, *loan, promote ? ids : in_host->ids, offsets,
                                      {.promote = promote});
    if (!f.ok() || f->fetched != blocks) {
      std::fprintf(stderr, "fetch failed: %s\n", f.status().ToString().c_str());
      return false;
    }
    if (promote) {
      for (const std::string& s : f->sources) all_from_gpu &= s == "gpu";
      daemon_us.push_back(static_cast<double>(f->daemon_micros));
    } else {
      for (const std::string& s : f->sources) all_from_host &= s == "host";
    }
    return true;
  };
  auto moved = (*client)->Reposition(*ns, ids, "", false, "gpu");
  if (!moved.ok()) return std::fprintf(stderr, "%s\n", moved.status().ToString().c_str()), 1;
  fetch(true);
  daemon_us.clear();
  const double from_gpu = MedianGbps(reps, total, [&] { return fetch(true); });
  const double whole_daemon_us = Median(daemon_us);
  // Where a call's time goes: one block (mostly the fixed cost of a call), the daemon's part of
  // it, and a control call (Stats) for the round trip alone.
  std::vector<double> one_us, one_daemon_us, stats_us;
  for (int r = 0; r < (smoke ? 3 : 50); ++r) {
    auto t0 = Clock::now();
    auto f = (*client)->FetchToDevice(*ns, *loan, std::span(ids).first(1),
                                      std::span(offsets).first(1), {});
    if (!f.ok()) return std::fprintf(stderr, "%s\n", f.status().ToString().c_str()), 1;
    one_us.push_back(strata::bench::Seconds(Clock::now() - t0) * 1e6);
    one_daemon_us.push_back(static_cast<double>(f->daemon_micros));
    t0 = Clock::now();
    if (!(*client)->Stats().ok()) return std::fprintf(stderr, "Stats failed\n"), 1;
    stats_us.push_back(strata::bench::Seconds(Clock::now() - t0) * 1e6);
  }
  std::vector<uint8_t> check(block_bytes);
  for (size_t i = 0; i < blocks; ++i) {
    cudaMemcpy(check.data(), static_cast<uint8_t*>(engine) + i * block_bytes, block_bytes,
               cudaMemcpyDeviceToHost);
    bytes_ok &= check == data[i];
  }
  const double from_host = MedianGbps(reps, total, [&] { return fetch(false); });

  // Publishes out of the engine's buffer (it holds the blocks fetched last): PublishFromDevice
  // against the engine doing it itself (cudaMemcpy to pinned memory, then Publish), each round
  // under fresh ids and evicted after.
  uint32_t round = 0;
  auto fresh_ids = [&](const strata::NamespaceId& in, size_t n, uint32_t tokens_per_block) {
    std::vector<uint32_t> t(n * tokens_per_block);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(1000000 * (++round) + i);
    auto got = (*client)->BlockIds(in, t);
    return got.ok() ? *got : std::vector<strata::BlockId>();
  };
  // `count` blocks of `bytes` at the start of the engine's buffer, published by stratad out of
  // it (*on_device: whether it encoded them there) ...
  auto publish_out = [&](const strata::NamespaceId& in, uint32_t tokens_per_block, size_t count,
                         uint64_t bytes, bool* on_device) {
    std::vector<uint64_t> at, sizes(count, bytes);
    for (size_t i = 0; i < count; ++i) at.push_back(i * bytes);
    const auto fresh = fresh_ids(in, count, tokens_per_block);
    auto p = (*client)->PublishFromDevice(in, *loan, fresh, {}, at, sizes);
    const bool ok = p.ok() && p->stored == count;
    if (!ok) std::fprintf(stderr, "publish from device: %s\n", p.status().ToString().c_str());
    if (ok && on_device) *on_device = p->encoded_on_device;
    (void)(*client)->Evict(in, fresh);
    return ok;
  };
  // ... or by this process: copied down to pinned memory, then published (encoded here).
  auto publish_via_host = [&](const strata::NamespaceId& in, uint32_t tokens_per_block,
                              size_t count, uint64_t bytes) {
    if (!Check(cudaMemcpy(pinned, engine, count * bytes, cudaMemcpyDeviceToHost), "d2h"))
      return false;
    std::vector<strata::ConstBuffer> host_views;
    for (size_t i = 0; i < count; ++i)
      host_views.push_back({static_cast<uint8_t*>(pinned) + i * bytes, bytes});
    const auto fresh = fresh_ids(in, count, tokens_per_block);
    auto p = (*client)->PublishIds(in, fresh, {}, host_views);
    const bool ok = p.ok() && p->stored == count;
    (void)(*client)->Evict(in, fresh);
    return ok;
  };
  const uint32_t tpb = spec.layout.tokens_per_block;
  publish_out(*ns, tpb, blocks, block_bytes, nullptr);
  const double out_gbps = MedianGbps(
      reps, total, [&] { return publish_out(*ns, tpb, blocks, block_bytes, nullptr); });
  const double via_host_gbps =
      MedianGbps(reps, total, [&] { return publish_via_host(*ns, tpb, blocks, block_bytes); });
  // A quant namespace: the daemon's CUDA encoder quantises where the blocks lie, against the
  // client library encoding on this process's CPU after a copy down.
  strata::NamespaceSpec qspec = spec;
  qspec.model_id = "gpu-fetch-bench-quant";
  qspec.layout = strata::KvLayout{4, 8, 128, strata::DType::kFloat16, 64,
                                  strata::KvKind::kSeparateKV};
  qspec.codec_policy = "quant:k4v4:had";
  const uint64_t kv_bytes = qspec.layout.BlockBytes();  // 1 MiB
  // At most 64 blocks: the CPU encoder's pace bounds a call (rpc deadline).
  const size_t kv_blocks = std::clamp<size_t>(total / kv_bytes, 1, 64);
  double quant_out = 0, quant_host = 0;
  bool device_encoded = false;
  auto qns = (*client)->OpenNamespace(qspec, "bench");
  const uint32_t qtpb = qspec.layout.tokens_per_block;
  const bool quant_ran = qns.ok() && kv_blocks * kv_bytes <= total;
  if (quant_ran) {
    std::vector<uint16_t> kv(kv_blocks * kv_bytes / 2);
    for (size_t k = 0; k < kv.size(); ++k)
      kv[k] = static_cast<uint16_t>(0x3000 + (k * 2654435761u >> 7) % 0x0C00);
    cudaMemcpy(engine, kv.data(), kv_blocks * kv_bytes, cudaMemcpyHostToDevice);
    quant_out = MedianGbps(reps, kv_blocks * kv_bytes, [&] {
      return publish_out(*qns, qtpb, kv_blocks, kv_bytes, &device_encoded);
    });
    quant_host = MedianGbps(reps, kv_blocks * kv_bytes,
                            [&] { return publish_via_host(*qns, qtpb, kv_blocks, kv_bytes); });
  }
  (void)(*client)->ReturnDeviceBuffer(*loan);

  std::printf("gpu_fetch_bench: %zu blocks of %llu bytes, %d reps\n", blocks,
              static_cast<unsigned long long>(block_bytes), reps);
  std::printf("baseline   cudaMemcpy d2d %.1f GB/s, h2d (pinned) %.1f GB/s\n", d2d, h2d);
  std::printf("ipc fetch  gpu tier -> engine buffer %.1f GB/s = %.2fx d2d (target >= 0.7)%s\n",
              from_gpu, from_gpu / d2d, all_from_gpu ? "" : " (NOT all from the gpu tier)");
  std::printf("ipc fetch  host memory -> engine buffer %.1f GB/s = %.2fx h2d%s\n", from_host,
              from_host / h2d, all_from_host ? "" : " (NOT all from host memory)");
  std::printf("per call   whole fetch %.0f us, of it in the daemon %.0f us; one block %.0f us "
              "(daemon %.0f us); a Stats call %.0f us (p50s)\n",
              total / from_gpu / 1e3, whole_daemon_us, Median(one_us), Median(one_daemon_us),
              Median(stats_us));
  std::printf("ipc publish engine buffer -> stratad %.1f GB/s = %.2fx cudaMemcpy d2h + Publish "
              "(%.1f GB/s)\n",
              out_gbps, out_gbps / via_host_gbps, via_host_gbps);
  std::printf("ipc publish quant:k4v4:had, encoded by stratad %s %.2f GB/s = %.2fx client "
              "encode + Publish (%.2f GB/s)\n",
              device_encoded ? "on the device" : "on its CPU", quant_out,
              quant_host > 0 ? quant_out / quant_host : 0, quant_host);
  std::printf("bytes      %s\n", bytes_ok ? "every block intact" : "MISMATCH");
  if (!json.empty())
    std::ofstream(json) << absl::StrFormat(
        "{\"block_bytes\":%d,\"blocks\":%d,\"d2d_gbps\":%.3f,\"h2d_gbps\":%.3f,"
        "\"ipc_fetch_gbps\":%.3f,\"ipc_fetch_vs_d2d\":%.3f,\"ipc_host_fetch_gbps\":%.3f,"
        "\"ipc_publish_gbps\":%.3f,\"d2h_publish_gbps\":%.3f,\"quant_device_publish_gbps\":%.3f,"
        "\"quant_client_publish_gbps\":%.3f,\"quant_encoded_on_device\":%s,\"bytes_ok\":%s,"
        "\"fetch_daemon_us\":%.0f,\"one_block_us\":%.0f,\"one_block_daemon_us\":%.0f,"
        "\"stats_call_us\":%.0f}\n",
        block_bytes, blocks, d2d, h2d, from_gpu, from_gpu / d2d, from_host, out_gbps,
        via_host_gbps, quant_out, quant_host, device_encoded ? "true" : "false",
        bytes_ok ? "true" : "false", whole_daemon_us, Median(one_us), Median(one_daemon_us),
        Median(stats_us));
  cudaFree(engine);
  cudaFree(src);
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);
  const bool ran = from_gpu > 0 && from_host > 0 && out_gbps > 0 && via_host_gbps > 0 &&
                   (!quant_ran || (quant_out > 0 && quant_host > 0));
  if (!ran) std::printf("gpu_fetch_bench: a phase failed (its figure is 0)\n");
  return bytes_ok && ran ? 0 : 1;
}
