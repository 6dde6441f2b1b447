// fio as the baseline of the NVMe benchmarks: one job (ioengine=io_uring, direct=1) on a file,
// parsed from its JSON output.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"

namespace strata::bench::fio {

inline bool Available() { return std::system("fio --version > /dev/null 2>&1") == 0; }

inline std::string Version() {
  FILE* p = popen("fio --version 2>/dev/null", "r");
  if (!p) return "";
  char buf[128] = {0};
  size_t n = fread(buf, 1, sizeof(buf) - 1, p);
  pclose(p);
  std::string v(buf, n);
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  return v;
}

// Number following `"key" : ` after position `from` in fio's JSON output, or -1.
inline double JsonNumber(const std::string& json, size_t from, const std::string& key) {
  size_t k = json.find("\"" + key + "\" : ", from);
  if (k == std::string::npos) return -1;
  return std::strtod(json.c_str() + k + key.size() + 5, nullptr);
}

inline std::string Command(const std::string& file, const std::string& rw, uint64_t bs, uint32_t qd,
                           uint64_t bytes, const std::string& extra) {
  return absl::StrFormat(
      "fio --name=strata_cmp --filename=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%d "
      "--iodepth=%d --size=%d --numjobs=1 --thread%s%s --output-format=json",
      file, rw, bs, qd, bytes, extra.empty() ? "" : " ", extra);
}

struct Result {
  double mibps = -1;          // -1: fio failed or printed no such section
  double cpu_us_per_op = -1;  // fio's usr + sys CPU per I/O, where it reports them
};

// rw: "write", "read", "randread", ...; extra: more fio flags (e.g. "--iomem=shmhuge").
inline Result Run(const std::string& file, const std::string& rw, uint64_t bs, uint32_t qd,
                  uint64_t bytes, const std::string& extra = "") {
  const std::string cmd = Command(file, rw, bs, qd, bytes, extra) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return {};
  const size_t sec = out.find(std::string("\"") + (rw == "write" ? "write" : "read") + "\" : {");
  if (sec == std::string::npos) return {};
  Result r;
  const double bw = JsonNumber(out, sec, "bw_bytes");
  if (bw <= 0) return {};
  r.mibps = bw / (1 << 20);
  // usr_cpu / sys_cpu are percentages of the job's run time (job_runtime, ms).
  const double usr = JsonNumber(out, 0, "usr_cpu"), sys = JsonNumber(out, 0, "sys_cpu");
  const double runtime_ms = JsonNumber(out, 0, "job_runtime");
  const double ios = static_cast<double>(bytes / bs);
  if (usr >= 0 && sys >= 0 && runtime_ms > 0 && ios > 0)
    r.cpu_us_per_op = (usr + sys) / 100.0 * runtime_ms * 1000.0 / ios;
  return r;
}

}  // namespace strata::bench::fio
