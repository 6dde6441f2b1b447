// A small Prometheus metrics registry: counters, gauges and fixed-bucket histograms, rendered in
// the Prometheus text exposition format (version 0.0.4).
//
// Hot path: a series is registered once (at start, or the first time a label combination is
// seen) and the caller keeps the returned pointer; updating it is one or two relaxed atomic
// operations, no lock and no allocation. Registration and rendering take the registry's mutex.
// Series live as long as the registry; their addresses never change.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace strata::daemon {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  // Mirrors a monotonic total that is kept elsewhere (e.g. inside the host tier).
  void Set(uint64_t total) { value_.store(total, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds().size() + 1 entries (the last is +Inf).
  std::vector<uint64_t> BucketCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

// Latency buckets in seconds, 25 us to 5 s: covers a loopback RPC up to a stalled one.
std::vector<double> LatencyBucketsSeconds();

class MetricsRegistry {
 public:
  enum class Type { kCounter, kGauge, kHistogram, kFloatCounter };

  // Returns the series of family `name` with `labels`, creating family and series as needed.
  // Same name and labels give the same series. A family's type and help are fixed by its first
  // registration.
  Counter* AddCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* AddGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  // A counter whose value is a float kept elsewhere (e.g. CPU seconds), set by a collector.
  Gauge* AddFloatCounter(const std::string& name, const std::string& help,
                         const MetricLabels& labels = {});
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const MetricLabels& labels = {});

  // Runs before every render, outside the registry's mutex, to refresh values that are read from
  // elsewhere (tier statistics). It may register series.
  void AddCollector(std::function<void()> collect);

  // The whole registry in text format 0.0.4; families in registration order.
  std::string Render();

 private:
  struct Series {
    MetricLabels labels;
    Counter counter;
    Gauge gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name, help;
    Type type;
    std::deque<Series> series;
  };
  Series* FindOrAdd(const std::string& name, const std::string& help, Type type,
                    const MetricLabels& labels, const std::vector<double>* bounds);

  absl::Mutex mu_;
  std::deque<Family> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Per-operation request counts, latency histograms and errors by status code for the Cache gRPC
// service. Operations are indexed by RpcMetrics::Op.
class RpcMetrics {
 public:
  enum Op {
    kConnect,
    kOpenNamespace,
    kLookup,
    kReserve,
    kCommit,
    kAbort,
    kAcquire,
    kRelease,
    kEvict,
    kPin,
    kUnpin,
    kStats,
    kNumOps
  };
  static const char* OpName(Op op);

  explicit RpcMetrics(MetricsRegistry* registry);
  // One finished call: `code` is the gRPC status code (0 = OK).
  void Record(Op op, int code, double seconds);
  // Bytes the daemon handed out for one-sided RMA: reserved for a publish (the client puts them
  // into the arena) or leased for a fetch (the client gets them). The transfer itself never
  // passes through the daemon, so this is what it can see of data-plane volume.
  void AddPublishBytes(uint64_t n) { publish_bytes_->Add(n); }
  void AddFetchBytes(uint64_t n) { fetch_bytes_->Add(n); }
  // Tokens covered by a lookup's blocks: the cached prefix (hit) and the rest (miss).
  void AddLookupTokens(uint64_t hit, uint64_t miss) {
    lookup_hit_tokens_->Add(hit);
    lookup_miss_tokens_->Add(miss);
  }
  // A Lookup answered over the UCX active-message fast path (also counted as method Lookup).
  void AddFastLookup() { fast_lookups_->Add(1); }

 private:
  static constexpr int kNumCodes = 17;
  MetricsRegistry* registry_;
  std::array<Counter*, kNumOps> requests_{};
  std::array<Histogram*, kNumOps> latency_{};
  Counter* publish_bytes_;
  Counter* lookup_hit_tokens_;
  Counter* lookup_miss_tokens_;
  Counter* fetch_bytes_;
  Counter* fast_lookups_;
  // Created the first time an (op, code) error happens.
  std::array<std::array<std::atomic<Counter*>, kNumCodes>, kNumOps> errors_{};
  absl::Mutex errors_mu_;
};

// The standard process_* metrics (CPU seconds, resident and virtual memory, open and maximum
// file descriptors, start time), read from /proc/self at scrape time.
void RegisterProcessMetrics(MetricsRegistry* registry);

// gRPC status code names as in the gRPC specification ("NOT_FOUND").
const char* GrpcCodeName(int code);

}  // namespace strata::daemon
