// Operability of a live stratad: /healthz, /readyz, /metrics checked by promtool, a real
// Prometheus server scraping the daemon and answering PromQL, and /metrics with many blocks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "codec/codec.h"
#include "codec/synthetic_kv.h"
#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/operability/ops_helpers.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::HttpGet;
using testing::RunCommand;

// A daemon with HTTP on an ephemeral loopback port.
// A GPU tier of host memory standing in for the device: its series are then exported.
constexpr char kGpuStandIn[] = "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n";

struct HttpDaemon {
  explicit HttpDaemon(const std::string& config = "host_tier:\n  capacity: 64MiB\n")
      : process(config, {"--http-listen", "127.0.0.1:0"}) {
    if (process.ok())
      http = testing::JsonField(testing::ReadFile(process.dir() + "/ready.json"), "http_endpoint");
  }
  bool ok() const { return process.ok() && !http.empty(); }
  DaemonProcess process;
  std::string http;
};

std::unique_ptr<Client> Connect(const DaemonProcess& d) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(OperabilityTest, HealthzAndReadyzAnswerAndReadyFileNamesHttpEndpoint) {
  HttpDaemon d;
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto health = HttpGet(d.http, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  auto ready = HttpGet(d.http, "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");
  EXPECT_EQ(HttpGet(d.http, "/nothing-here").status, 404);
  // Without --http-listen (the default config) there is no HTTP endpoint at all.
  DaemonProcess plain;
  ASSERT_TRUE(plain.ok()) << plain.log();
  EXPECT_EQ(testing::JsonField(testing::ReadFile(plain.dir() + "/ready.json"), "http_endpoint"),
            "");
}

TEST(OperabilityTest, BadOrTakenHttpAddressIsRefusedNamingTheField) {
  auto [code, out] = RunCommand(std::string(STRATAD_BIN) + " --http-listen nonsense");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("http_listen"), std::string::npos) << out;

  HttpDaemon first;
  ASSERT_TRUE(first.ok()) << first.process.log();
  DaemonProcess second("", {"--http-listen", first.http});
  EXPECT_FALSE(second.ok());
  auto exit_code = second.WaitExit(std::chrono::seconds(10));
  ASSERT_TRUE(exit_code.has_value());
  EXPECT_NE(*exit_code, 0);
  EXPECT_NE(second.log().find("http_listen"), std::string::npos) << second.log();
}

TEST(OperabilityTest, LiveScrapePassesPromtoolAndCountsWhatHappened) {
  std::string promtool = testing::FindExecutable("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not installed (Debian package 'prometheus')";
  HttpDaemon d;
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto client = Connect(d.process);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(testing::OpsSpec(), "tenant-ops");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto ids = testing::PublishMany(*client, *ns, 7, 512);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(*client->LookupIds(*ns, *ids), 7u);
  BlockId absent = ComputeBlockId(*ns, std::vector<uint32_t>{1, 2, 3, 4});
  ASSERT_EQ(*client->LookupIds(*ns, {&absent, 1}), 0u);  // one block's tokens missed
  std::vector<uint8_t> buf(512);
  MutableBuffer dst{buf.data(), buf.size()};
  ASSERT_TRUE(client->Fetch(*ns, std::span<const BlockId>(ids->data(), 1), {&dst, 1}).ok());
  // An error with a known code: Evict in a namespace this daemon never opened fails with
  // FAILED_PRECONDITION.
  NamespaceId unknown;
  unknown.bytes[0] = 1;
  EXPECT_FALSE(client->Evict(unknown, *ids).ok());

  auto m = HttpGet(d.http, "/metrics");
  ASSERT_EQ(m.status, 200);
  std::string file = d.process.dir() + "/scrape.txt";
  std::ofstream(file) << m.body;
  auto [code, out] = RunCommand(promtool + " check metrics < " + file);
  EXPECT_EQ(code, 0) << out << "\n" << m.body;

  using testing::SampleValue;
  EXPECT_EQ(SampleValue(m.body, "strata_tier_blocks{tier=\"host\"}"), 7);
  EXPECT_EQ(SampleValue(m.body, "strata_committed_blocks_total"), 7);
  EXPECT_EQ(SampleValue(m.body, "strata_tier_capacity_bytes{tier=\"host\"}"), 64 << 20);
  // 4096, or 2097152 where the arena sits on reserved huge pages.
  auto page = SampleValue(m.body, "strata_host_arena_page_bytes");
  ASSERT_TRUE(page.has_value());
  EXPECT_TRUE(*page == 4096 || *page == 2097152) << *page;
  EXPECT_GE(*SampleValue(m.body, "strata_tier_used_bytes{tier=\"host\"}"), 7 * 512);
  EXPECT_EQ(SampleValue(m.body, "strata_lookup_blocks_total{result=\"hit\"}"), 7);
  // OpsSpec blocks hold 4 tokens: 7 blocks found, 1 missed.
  EXPECT_EQ(SampleValue(m.body, "strata_lookup_tokens_total{result=\"hit\"}"), 7 * 4);
  EXPECT_EQ(SampleValue(m.body, "strata_lookup_tokens_total{result=\"miss\"}"), 4);
  EXPECT_EQ(SampleValue(m.body, "strata_fetch_blocks_total{result=\"hit\"}"), 1);
  EXPECT_EQ(SampleValue(m.body, "strata_rpc_requests_total{method=\"Lookup\"}"), 2);
  // Both went over the UCX active-message fast path, not gRPC.
  EXPECT_EQ(SampleValue(m.body, "strata_lookup_fast_path_total"), 2);
  // ... answered by a data-plane worker, with the fetch's acquire.
  auto requests = SampleValue(m.body, "strata_data_plane_requests_total{worker=\"0\"}");
  ASSERT_TRUE(requests.has_value()) << m.body;
  EXPECT_GE(*requests, 3);
  EXPECT_EQ(SampleValue(m.body, "strata_rpc_duration_seconds_count{method=\"Commit\"}"), 1);
  EXPECT_EQ(
      SampleValue(m.body, "strata_rpc_errors_total{method=\"Evict\",code=\"FAILED_PRECONDITION\"}"),
      1)
      << m.body;
  // The fetch's lease ends by a one-way release the client does not wait for: scraped again
  // until it has arrived (a loaded machine delays it by milliseconds).
  auto leases = SampleValue(m.body, "strata_open_leases");
  for (int i = 0; i < 200 && leases != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    leases = SampleValue(HttpGet(d.http, "/metrics").body, "strata_open_leases");
  }
  EXPECT_EQ(leases, 0);
  EXPECT_EQ(SampleValue(m.body, "strata_data_plane_bytes_total{direction=\"publish\"}"), 7 * 512);
  EXPECT_EQ(SampleValue(m.body, "strata_data_plane_bytes_total{direction=\"fetch\"}"), 512);
  EXPECT_EQ(SampleValue(m.body, "strata_build_info{version=\"" STRATA_VERSION "\"}"), 1);
  // The codec's CPU paths, as this process finds them on the same machine and environment.
  const std::vector<codec::CpuKernel> kernels = codec::CpuKernels();
  ASSERT_EQ(kernels.size(), 4u);
  for (const codec::CpuKernel& k : kernels)
    EXPECT_EQ(SampleValue(m.body, "strata_codec_kernel_info{part=\"" + k.part + "\",kernel=\"" +
                                      k.kernel + "\"}"),
              1)
        << m.body;
}

// A real Prometheus server scrapes the daemon; its HTTP API answers PromQL with what we published.
TEST(OperabilityTest, PrometheusServerScrapesDaemonAndAnswersPromQL) {
  std::string prometheus = testing::FindExecutable("prometheus");
  if (prometheus.empty()) GTEST_SKIP() << "prometheus not installed (Debian package 'prometheus')";
  // With an NVMe tier, so that the rules on NVMe series (StrataNvmeTierDegraded) evaluate against
  // exported metrics too.
  struct TempDir {
    std::string path = testing::MakeTempDir("prom-nvme");
    ~TempDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } nvme;
  // Every tier, so that every dashboard panel has series (the GPU tier's memory stands in).
  HttpDaemon d("host_tier:\n  capacity: 64MiB\nnvme:\n  files:\n    - {path: " + nvme.path +
               "/tier0, capacity: 1MiB}\n  catalog_dir: " + nvme.path + "/catalog\n" + kGpuStandIn);
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto client = Connect(d.process);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(testing::OpsSpec(), "tenant-prom");
  ASSERT_TRUE(ns.ok()) << ns.status();
  constexpr size_t kBlocks = 42;
  ASSERT_TRUE(testing::PublishMany(*client, *ns, kBlocks, 1024).ok());

  std::string dir = testing::MakeTempDir("prometheus");
  std::ofstream(dir + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files:\n  - " << STRATA_SOURCE_DIR << "/charts/strata/alerts/strata-alerts.yaml\n"
      << "scrape_configs:\n  - job_name: strata\n    static_configs:\n"
      << "      - targets: ['" << d.http << "']\n";
  // Prometheus cannot report an ephemeral port, so it gets one that was free a moment ago; if
  // another process takes it first, Prometheus exits and we try again on another.
  std::string web;
  pid_t pid = -1;
  struct Cleanup {
    pid_t& pid;
    std::string dir;
    ~Cleanup() {
      if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) != pid; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        kill(pid, SIGKILL);
        waitpid(pid, &st, WNOHANG);
      }
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{pid, dir};
  for (int attempt = 0; attempt < 3 && pid < 0; ++attempt) {
    int port = testing::FreeLoopbackPort();
    ASSERT_GT(port, 0);
    web = "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {prometheus, "--config.file=" + dir + "/prometheus.yml",
                                     "--storage.tsdb.path=" + dir + "/data",
                                     "--web.listen-address=" + web, "--log.level=warn"};
    pid = testing::Spawn(args, dir + "/prometheus.log", /*append=*/true);
    ASSERT_GT(pid, 0);
    bool ready = false;
    for (int i = 0; i < 150 && !ready; ++i) {
      int st;
      if (waitpid(pid, &st, WNOHANG) == pid) break;  // exited: port taken, or worse
      ready = HttpGet(web, "/-/ready", 1).status == 200;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!ready) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ASSERT_GT(pid, 0) << "prometheus did not become ready:\n"
                    << testing::ReadFile(dir + "/prometheus.log");
  // sum by (job) of a counter the daemon exports; Prometheus returns it as a JSON vector.
  const std::string query =
      "/api/v1/query?query=sum%20by%20(job)%20(strata_committed_blocks_total%7Bjob%3D%22strata%22"
      "%7D)";
  const std::string want = "\"" + std::to_string(kBlocks) + "\"]";
  std::string last;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  bool answered = false;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = HttpGet(web, query, 2);
    last = r.body;
    if (r.status == 200 && r.body.find("\"status\":\"success\"") != std::string::npos &&
        r.body.find(want) != std::string::npos) {
      answered = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_TRUE(answered) << "last answer: " << last << "\nprometheus log:\n"
                        << testing::ReadFile(dir + "/prometheus.log");
  // The target is healthy from Prometheus's side too.
  auto up = HttpGet(web, "/api/v1/query?query=up%7Bjob%3D%22strata%22%7D");
  EXPECT_NE(up.body.find("\"1\"]"), std::string::npos) << up.body;

  // Every query of the Grafana dashboard parses and returns data from this daemon's series
  // (rates need two scrapes in the window, so retry for a few seconds).
  std::string dashboard = testing::ReadFile(std::string(STRATA_SOURCE_DIR) +
                                            "/charts/strata/dashboards/strata-overview.json");
  auto exprs = testing::DashboardExprs(dashboard);
  ASSERT_GE(exprs.size(), 10u);
  auto colon = web.rfind(':');
  httplib::Client api(web.substr(0, colon), std::stoi(web.substr(colon + 1)));
  api.set_read_timeout(5, 0);
  for (std::string expr : exprs) {
    for (auto [from, to] :
         {std::pair<std::string, std::string>{"$__rate_interval", "30s"}, {"$instance", ".*"}})
      for (size_t p; (p = expr.find(from)) != std::string::npos;) expr.replace(p, from.size(), to);
    std::string body;
    bool has_data = false;
    for (int attempt = 0; attempt < 40 && !has_data; ++attempt) {
      auto r = api.Post("/api/v1/query", httplib::Params{{"query", expr}});
      ASSERT_TRUE(r) << expr;
      body = r->body;
      ASSERT_EQ(r->status, 200) << expr << "\n" << body;
      has_data = body.find("\"result\":[]") == std::string::npos;
      if (!has_data) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    EXPECT_TRUE(has_data) << "dashboard query returned no series: " << expr << "\n" << body;
  }

  // The alerting rules load and evaluate without error against this daemon's series, and name
  // only metrics it exports (or `up`).
  auto exported = testing::ExportedNames(HttpGet(d.http, "/metrics").body);
  std::string rules;
  size_t evaluated = 0;
  for (int attempt = 0; attempt < 40; ++attempt) {
    rules = HttpGet(web, "/api/v1/rules").body;
    evaluated = 0;
    for (size_t p = 0; (p = rules.find("\"health\":\"ok\"", p)) != std::string::npos; ++p)
      ++evaluated;
    if (evaluated >= 8) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_GE(evaluated, 8u) << rules;
  EXPECT_EQ(rules.find("\"health\":\"err\""), std::string::npos) << rules;
  std::string as_exprs;  // the rules' "query" fields, read with the dashboard's "expr" reader
  for (size_t p = 0; (p = rules.find("\"query\":", p)) != std::string::npos; p += 8)
    as_exprs += "\"expr\":" + rules.substr(p + 8, rules.find("\",\"", p + 9) - p - 7) + ",";
  auto queries = testing::DashboardExprs(as_exprs);
  EXPECT_GE(queries.size(), 8u) << rules;
  size_t names = 0;
  for (const std::string& q : queries)
    for (const std::string& name : testing::MetricNamesIn(q)) {
      ++names;
      EXPECT_NE(std::find(exported.begin(), exported.end(), name), exported.end())
          << name << " (in alert " << q << ") is not exported";
    }
  EXPECT_GE(names, 9u);  // every rule but StrataDaemonDown (`up`) names one or two
}

// Every metric a dashboard query names is one the daemon exports (checked on a live scrape).
// Issue 14 leftover: the per-tenant quota accounting of the host tier is on /metrics, with a
// label per tenant of the tokens file and everything else summed into tenant="_other" (a client
// cannot grow the series count by inventing tenant names).
TEST(OperabilityTest, PerTenantHostUsageIsExportedForTokensFileTenants) {
  struct TempDir {
    std::string path = testing::MakeTempDir("tenant-metrics");
    ~TempDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } dir;
  const std::string token_a = "tenant-a-token-0123456789abcdef0123456789";
  const std::string token_admin = "admin-token-0123456789abcdef0123456789ab";
  std::ofstream(dir.path + "/tokens") << token_a << " tenant-a tenant\n"
                                      << "tenant-b-token-0123456789abcdef012345678 tenant-b "
                                         "tenant\n"
                                      << token_admin << " ops admin\n";
  HttpDaemon d("host_tier:\n  capacity: 64MiB\nlimits:\n  tenant_max_share: 0.5\nauth:\n"
               "  tokens_file: " + dir.path + "/tokens\n");
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto connect = [&](const std::string& token) {
    ClientOptions o;
    o.endpoint = d.process.endpoint();
    o.auth_token = token;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  };
  auto a = connect(token_a);
  auto admin = connect(token_admin);
  ASSERT_TRUE(a && admin);
  auto ns_a = a->OpenNamespace(testing::OpsSpec(), "tenant-a");
  ASSERT_TRUE(ns_a.ok()) << ns_a.status();
  ASSERT_TRUE(testing::PublishMany(*a, *ns_a, 10, 4096).ok());
  // The admin may name any tenant: one not in the tokens file lands in "_other".
  auto ns_x = admin->OpenNamespace(testing::OpsSpec(), "made-up-tenant");
  ASSERT_TRUE(ns_x.ok()) << ns_x.status();
  ASSERT_TRUE(testing::PublishMany(*admin, *ns_x, 3, 4096, 2).ok());

  const std::string m = HttpGet(d.http, "/metrics").body;
  auto value = [&](const std::string& series) {
    auto v = testing::SampleValue(m, series);
    EXPECT_TRUE(v.has_value()) << series << " missing\n" << m.substr(0, 2000);
    return v.value_or(-1);
  };
  EXPECT_GE(value("strata_tenant_committed_bytes{tenant=\"tenant-a\"}"), 10 * 4096);
  EXPECT_EQ(value("strata_tenant_committed_bytes{tenant=\"tenant-b\"}"), 0);
  EXPECT_GE(value("strata_tenant_committed_bytes{tenant=\"_other\"}"), 3 * 4096);
  EXPECT_EQ(value("strata_tenant_reserved_bytes{tenant=\"tenant-a\"}"), 0);
  EXPECT_EQ(value("strata_quota_evictions_total"), 0);
  EXPECT_EQ(value("strata_quota_no_space_blocks_total"), 0);
  EXPECT_EQ(m.find("made-up-tenant"), std::string::npos) << "a tenant outside the tokens file got a label";
  auto families = testing::MetricFamilies(m);
  EXPECT_EQ(std::count(families.begin(), families.end(), "strata_tenant_committed_bytes"), 1);
}

TEST(OperabilityTest, CodecRatioFollowsCodecNamespaces) {
  HttpDaemon d;
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto client = Connect(d.process);
  ASSERT_TRUE(client);
  NamespaceSpec spec = testing::OpsSpec();
  spec.layout = KvLayout{2, 2, 64, DType::kFloat16, 16, KvKind::kSeparateKV};
  spec.codec_policy = "lossless";
  auto ns = client->OpenNamespace(spec, "tenant-codec");
  ASSERT_TRUE(ns.ok()) << ns.status();
  // Smooth values compress well losslessly; the daemon only sees the blobs.
  const size_t block = spec.layout.BlockBytes();
  std::vector<uint8_t> kv(3 * block);
  for (size_t i = 0; i + 1 < kv.size(); i += 2) {
    uint16_t h = static_cast<uint16_t>(0x3C00 + (i / 2) % 7);  // 1.0 plus a few ulps
    std::memcpy(&kv[i], &h, 2);
  }
  std::vector<ConstBuffer> in;
  for (int b = 0; b < 3; ++b) in.push_back({kv.data() + b * block, block});
  std::vector<uint32_t> tokens(3 * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 13);
  auto pub = client->Publish(*ns, tokens, in);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 3u);
  auto m = HttpGet(d.http, "/metrics");
  ASSERT_EQ(m.status, 200);
  using testing::SampleValue;
  EXPECT_EQ(SampleValue(m.body, "strata_codec_raw_bytes"), static_cast<double>(3 * block));
  EXPECT_EQ(SampleValue(m.body, "strata_codec_stored_bytes"), static_cast<double>(pub->bytes_sent));
  auto ratio = SampleValue(m.body, "strata_codec_ratio");
  ASSERT_TRUE(ratio.has_value());
  EXPECT_NEAR(*ratio, 3.0 * block / pub->bytes_sent, 1e-6);
  EXPECT_GT(*ratio, 1.0);
}

// The calibration series: the artefacts stored, and the parsed calibrations cold transcoding
// decodes xl blobs through, kept within one byte here: once blobs of both versions go cold,
// each switch between them drops the other version's parse.
TEST(OperabilityTest, CalibrationSeriesFollowTheStoreAndTheParsedCache) {
  HttpDaemon d("host_tier:\n  capacity: 1MiB\nlimits:\n  parsed_calibration_bytes: 1\n");
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto client = Connect(d.process);
  ASSERT_TRUE(client);
  NamespaceSpec spec = testing::SmallSpec("ops-calibrations");  // 128 KiB raw per block
  spec.codec_policy = "xl:s0.15";
  spec.layout.tokens_per_block = 64;
  NamespaceOptions options;
  options.cold_codec = "xl:r1.4";
  auto ns = client->OpenNamespace(spec, "tenant-cal", options);
  ASSERT_TRUE(ns.ok()) << ns.status();
  constexpr size_t kPerVersion = 80, kSamples = 16;
  const size_t bytes = spec.layout.BlockBytes();
  const auto kv = codec::GenerateSyntheticKv(spec.layout, 2 * kPerVersion + kSamples,
                                             codec::SyntheticKvParams{});
  auto block = [&](size_t i) { return ConstBuffer{kv.data() + i * bytes, bytes}; };
  std::vector<ConstBuffer> samples;
  for (size_t i = 0; i < kSamples; ++i) samples.push_back(block(2 * kPerVersion + i));
  auto transcoding = [&] {
    auto s = client->Stats();
    if (!s.ok()) return uint64_t{0};
    for (auto& [k, v] : s->counters)
      if (k == "transcoding_blocks") return v;
    return uint64_t{0};
  };
  for (int version = 1; version <= 2; ++version) {
    CalibrationRequest req;
    req.step = version == 1 ? 0.15 : 0.12;
    auto cal = client->Calibrate(*ns, samples, req);
    ASSERT_TRUE(cal.ok()) << cal.status();
    for (size_t p = (version - 1) * kPerVersion; p < version * kPerVersion; ++p) {
      const ConstBuffer in = block(p);
      auto pub = client->Publish(*ns, testing::Tokens(64, 5000 + 64 * static_cast<uint32_t>(p)),
                                 {&in, 1});
      ASSERT_TRUE(pub.ok()) << pub.status();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (transcoding() != 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  auto m = HttpGet(d.http, "/metrics");
  ASSERT_EQ(m.status, 200);
  using testing::SampleValue;
  std::printf("transcoded %.0f blocks; parsed calibrations %.0f bytes, %.0f evictions\n",
              SampleValue(m.body, "strata_transcoded_blocks_total").value_or(-1),
              SampleValue(m.body, "strata_parsed_calibration_bytes").value_or(-1),
              SampleValue(m.body, "strata_parsed_calibration_evictions_total").value_or(-1));
  EXPECT_EQ(SampleValue(m.body, "strata_calibrations"), 2.0);
  EXPECT_GT(SampleValue(m.body, "strata_calibration_bytes").value_or(0), 0.0);
  EXPECT_GT(SampleValue(m.body, "strata_transcoded_blocks_total").value_or(0), 0.0);
  EXPECT_GE(SampleValue(m.body, "strata_parsed_calibration_evictions_total").value_or(0), 1.0);
  EXPECT_GT(SampleValue(m.body, "strata_parsed_calibration_bytes").value_or(0), 0.0);
}

TEST(OperabilityTest, DashboardNamesOnlyExportedMetrics) {
  HttpDaemon d(std::string("host_tier:\n  capacity: 64MiB\n") + kGpuStandIn);
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto m = HttpGet(d.http, "/metrics");
  ASSERT_EQ(m.status, 200);
  auto exported = testing::ExportedNames(m.body);
  std::string dashboard = testing::ReadFile(std::string(STRATA_SOURCE_DIR) +
                                            "/charts/strata/dashboards/strata-overview.json");
  auto exprs = testing::DashboardExprs(dashboard);
  ASSERT_GE(exprs.size(), 10u);
  size_t names = 0;
  for (const std::string& expr : exprs) {
    auto used = testing::MetricNamesIn(expr);
    EXPECT_FALSE(used.empty()) << "query names no daemon metric: " << expr;
    for (const std::string& name : used) {
      ++names;
      EXPECT_NE(std::find(exported.begin(), exported.end(), name), exported.end())
          << name << " (in " << expr << ") is not exported";
    }
  }
  EXPECT_GE(names, exprs.size());
}

// /metrics stays correct and answers with 100k blocks resident (timings: metrics_scrape_bench).
TEST(OperabilityTest, MetricsAnswersWithManyBlocksResident) {
  HttpDaemon d("host_tier:\n  capacity: 128MiB\n");
  ASSERT_TRUE(d.ok()) << d.process.log();
  auto client = Connect(d.process);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(testing::OpsSpec(), "tenant-many");
  ASSERT_TRUE(ns.ok()) << ns.status();
  constexpr size_t kBlocks = 100000;
  auto ids = testing::PublishMany(*client, *ns, kBlocks, 64);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_TRUE(client->Pin(*ns, std::span<const BlockId>(ids->data(), 10), absl::Minutes(5)).ok());
  for (int i = 0; i < 20; ++i) {
    auto m = HttpGet(d.http, "/metrics");
    ASSERT_EQ(m.status, 200);
    EXPECT_EQ(testing::SampleValue(m.body, "strata_tier_blocks{tier=\"host\"}"), kBlocks);
    EXPECT_EQ(testing::SampleValue(m.body, "strata_tier_pinned_blocks{tier=\"host\"}"), 10);
  }
}

}  // namespace
}  // namespace strata
