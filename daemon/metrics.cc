#include "daemon/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace strata::daemon {
namespace {

void AppendNumber(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest exact round-trip form
    out.append(buf, r.ptr);
  }
}

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// Label values escape backslash, double quote and newline; help text escapes backslash and
// newline (text format 0.0.4).
void AppendEscaped(std::string& out, const std::string& s, bool quote) {
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
}

// {a="x",b="y"} with an optional extra label (le for histogram buckets).
void AppendLabels(std::string& out, const MetricLabels& labels, const char* extra_name = nullptr,
                  const std::string& extra_value = "") {
  if (labels.empty() && !extra_name) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    AppendEscaped(out, v, true);
    out += '"';
  }
  if (extra_name) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  double cur = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> LatencyBucketsSeconds() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
          25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0};
}

MetricsRegistry::Series* MetricsRegistry::FindOrAdd(const std::string& name,
                                                    const std::string& help, Type type,
                                                    const MetricLabels& labels,
                                                    const std::vector<double>* bounds) {
  absl::MutexLock lock(&mu_);
  Family* family = nullptr;
  for (Family& f : families_)
    if (f.name == name) family = &f;
  if (!family) {
    families_.push_back(Family{name, help, type, {}});
    family = &families_.back();
  }
  for (Series& s : family->series)
    if (s.labels == labels) return &s;
  Series& s = family->series.emplace_back();
  s.labels = labels;
  if (type == Type::kHistogram) s.histogram = std::make_unique<Histogram>(*bounds);
  return &s;
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  return &FindOrAdd(name, help, Type::kCounter, labels, nullptr)->counter;
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  return &FindOrAdd(name, help, Type::kGauge, labels, nullptr)->gauge;
}

Gauge* MetricsRegistry::AddFloatCounter(const std::string& name, const std::string& help,
                                        const MetricLabels& labels) {
  return &FindOrAdd(name, help, Type::kFloatCounter, labels, nullptr)->gauge;
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds,
                                         const MetricLabels& labels) {
  return FindOrAdd(name, help, Type::kHistogram, labels, &bounds)->histogram.get();
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Render() {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (auto& c : collectors) c();

  std::string out;
  out.reserve(16 << 10);
  absl::MutexLock lock(&mu_);
  for (const Family& f : families_) {
    if (f.series.empty()) continue;
    out += "# HELP ";
    out += f.name;
    out += ' ';
    AppendEscaped(out, f.help, false);
    out += "\n# TYPE ";
    out += f.name;
    out += f.type == Type::kCounter || f.type == Type::kFloatCounter ? " counter\n"
           : f.type == Type::kGauge                                  ? " gauge\n"
                                                                     : " histogram\n";
    for (const Series& s : f.series) {
      switch (f.type) {
        case Type::kCounter:
          out += f.name;
          AppendLabels(out, s.labels);
          out += ' ';
          AppendUint(out, s.counter.value());
          out += '\n';
          break;
        case Type::kGauge:
        case Type::kFloatCounter:
          out += f.name;
          AppendLabels(out, s.labels);
          out += ' ';
          AppendNumber(out, s.gauge.value());
          out += '\n';
          break;
        case Type::kHistogram: {
          const Histogram& h = *s.histogram;
          std::vector<uint64_t> counts = h.BucketCounts();
          uint64_t cumulative = 0;
          for (size_t i = 0; i < counts.size(); ++i) {
            cumulative += counts[i];
            std::string le;
            if (i < h.bounds().size())
              AppendNumber(le, h.bounds()[i]);
            else
              le = "+Inf";
            out += f.name;
            out += "_bucket";
            AppendLabels(out, s.labels, "le", le);
            out += ' ';
            AppendUint(out, cumulative);
            out += '\n';
          }
          out += f.name;
          out += "_sum";
          AppendLabels(out, s.labels);
          out += ' ';
          AppendNumber(out, h.sum());
          out += '\n';
          out += f.name;
          out += "_count";
          AppendLabels(out, s.labels);
          out += ' ';
          AppendUint(out, cumulative);
          out += '\n';
          break;
        }
      }
    }
  }
  return out;
}

void RegisterProcessMetrics(MetricsRegistry* r) {
  Gauge* cpu = r->AddFloatCounter("process_cpu_seconds_total",
                                  "Total user and system CPU time spent in seconds.");
  Gauge* rss = r->AddGauge("process_resident_memory_bytes", "Resident memory size in bytes.");
  Gauge* vsize = r->AddGauge("process_virtual_memory_bytes", "Virtual memory size in bytes.");
  Gauge* fds = r->AddGauge("process_open_fds", "Number of open file descriptors.");
  Gauge* max_fds = r->AddGauge("process_max_fds", "Maximum number of open file descriptors.");
  r->AddGauge("process_start_time_seconds",
              "Start time of the process since unix epoch in seconds.")
      ->Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count());
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  r->AddCollector([=] {
    // /proc/self/stat: fields after the parenthesised command; utime and stime are fields 14
    // and 15, vsize 23 and rss (pages) 24.
    std::ifstream in("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    size_t close = stat.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(stat.substr(close + 2));
      std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
      // f[0] is field 3 (state).
      if (f.size() > 21) {
        cpu->Set((std::stod(f[11]) + std::stod(f[12])) / ticks);
        vsize->Set(std::stod(f[20]));
        rss->Set(std::stod(f[21]) * page);
      }
    }
    std::error_code ec;
    size_t n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
      ++n;
    fds->Set(static_cast<double>(n));
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0) max_fds->Set(static_cast<double>(lim.rlim_cur));
  });
}

const char* RpcMetrics::OpName(Op op) {
  static const char* names[kNumOps] = {"Connect", "OpenNamespace", "Lookup",  "Reserve",
                                       "Commit",  "Abort",         "Acquire", "Release",
                                       "Evict",   "Pin",           "Unpin",   "Stats"};
  return op >= 0 && op < kNumOps ? names[op] : "unknown";
}

const char* GrpcCodeName(int code) {
  static const char* names[] = {"OK",
                                "CANCELLED",
                                "UNKNOWN",
                                "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED",
                                "NOT_FOUND",
                                "ALREADY_EXISTS",
                                "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION",
                                "ABORTED",
                                "OUT_OF_RANGE",
                                "UNIMPLEMENTED",
                                "INTERNAL",
                                "UNAVAILABLE",
                                "DATA_LOSS",
                                "UNAUTHENTICATED"};
  return code >= 0 && code < 17 ? names[code] : "UNKNOWN";
}

RpcMetrics::RpcMetrics(MetricsRegistry* registry) : registry_(registry) {
  for (int op = 0; op < kNumOps; ++op) {
    MetricLabels labels = {{"method", OpName(static_cast<Op>(op))}};
    requests_[op] = registry->AddCounter(
        "strata_rpc_requests_total", "Cache gRPC calls handled, by method (any status).", labels);
    latency_[op] = registry->AddHistogram(
        "strata_rpc_duration_seconds",
        "Time stratad spent handling a Cache gRPC call, by method (server side, excluding the "
        "network).",
        LatencyBucketsSeconds(), labels);
  }
  const char* bytes_help =
      "Block bytes granted to clients for one-sided RMA, by direction: reserved for a publish "
      "(client puts into the arena) or leased for a fetch (client gets from it).";
  publish_bytes_ =
      registry->AddCounter("strata_data_plane_bytes_total", bytes_help, {{"direction", "publish"}});
  fetch_bytes_ =
      registry->AddCounter("strata_data_plane_bytes_total", bytes_help, {{"direction", "fetch"}});
  const char* tokens_help =
      "Prompt tokens covered by looked-up blocks: in the cached prefix (hit) or after it (miss).";
  lookup_hit_tokens_ =
      registry->AddCounter("strata_lookup_tokens_total", tokens_help, {{"result", "hit"}});
  lookup_miss_tokens_ =
      registry->AddCounter("strata_lookup_tokens_total", tokens_help, {{"result", "miss"}});
  fast_lookups_ = registry->AddCounter(
      "strata_lookup_fast_path_total",
      "Lookups answered over the UCX active-message fast path instead of gRPC (they are counted "
      "under method=\"Lookup\" in strata_rpc_requests_total too).");
  // One zero series up front, so the family is documented and sum(rate(...)) has data before
  // the first error.
  errors_[kLookup][14].store(
      registry->AddCounter("strata_rpc_errors_total",
                           "Cache gRPC calls that ended with a non-OK status, by method and "
                           "gRPC status code.",
                           {{"method", "Lookup"}, {"code", "UNAVAILABLE"}}),
      std::memory_order_release);
}

void RpcMetrics::Record(Op op, int code, double seconds) {
  if (op < 0 || op >= kNumOps) return;
  requests_[op]->Add();
  latency_[op]->Observe(seconds);
  if (code == 0) return;
  if (code < 0 || code >= kNumCodes) code = 2;  // UNKNOWN
  Counter* c = errors_[op][code].load(std::memory_order_acquire);
  if (!c) {
    absl::MutexLock lock(&errors_mu_);
    c = errors_[op][code].load(std::memory_order_acquire);
    if (!c) {
      c = registry_->AddCounter("strata_rpc_errors_total", "",
                                {{"method", OpName(op)}, {"code", GrpcCodeName(code)}});
      errors_[op][code].store(c, std::memory_order_release);
    }
  }
  c->Add();
}

}  // namespace strata::daemon
