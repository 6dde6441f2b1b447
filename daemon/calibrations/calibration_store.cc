#include "daemon/calibrations/calibration_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/cross_layer.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace strata::daemon {
namespace {

constexpr char kSuffix[] = ".skvp";
constexpr size_t kSuffixBytes = sizeof(kSuffix) - 1;

std::string FileName(const NamespaceId& ns, uint64_t id) {
  return absl::StrCat(ns.ToHex(), "-", codec::CalibrationIdString(id), kSuffix);
}

// Writes `bytes` to `path` so that a crash leaves either the whole file or none: a temporary
// file, fsync, rename, fsync of the directory.
absl::Status WriteDurably(const std::string& dir, const std::string& name,
                          const std::string& bytes) {
  // A temporary file of its own per write: two Puts of one artefact at once (a client's and a
  // peer's copy) must not truncate each other's file nor rename it away.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = absl::StrCat(dir, "/.", name, ".", ::getpid(), ".", writes++, ".tmp");
  const std::string path = absl::StrCat(dir, "/", name);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot sync ", tmp, ": ", strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", strerror(err)));
  }
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CalibrationRecord> DescribeCalibration(const NamespaceId& ns, std::string artefact,
                                                      codec::Calibration* parsed_out) {
  if (artefact.size() > kMaxCalibrationBytes)
    return absl::InvalidArgumentError(absl::StrCat("calibration of ", artefact.size(),
                                                   " bytes; at most ", kMaxCalibrationBytes));
  auto parsed = codec::Calibration::Parse(
      {reinterpret_cast<const uint8_t*>(artefact.data()), artefact.size()});
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("not a valid calibration: ", parsed.status().message()));
  CalibrationRecord r;
  r.ns = ns;
  r.id = parsed->Id();
  r.version = parsed->version;
  r.num_layers = parsed->num_layers;
  r.num_kv_heads = parsed->num_kv_heads;
  r.head_dim = parsed->head_dim;
  r.target_bits = parsed->target_bits;
  r.sample_bits = parsed->sample_bits;
  r.rope_theta = parsed->rope_theta;
  r.mode = std::string(parsed->ModeName());
  r.step = parsed->cross_layer ? parsed->cross_layer->step : 0;
  r.added = absl::Now();
  r.artefact = std::make_shared<const std::string>(std::move(artefact));
  if (parsed_out) *parsed_out = *std::move(parsed);
  return r;
}

absl::StatusOr<std::unique_ptr<CalibrationStore>> CalibrationStore::Open(std::string dir,
                                                                         Limits limits) {
  std::unique_ptr<CalibrationStore> store(new CalibrationStore(std::move(dir), limits));
  if (!store->dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(store->dir_, ec);
    if (ec)
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the calibration directory ", store->dir_, ": ", ec.message()));
    if (auto s = store->Load(); !s.ok()) return s;
  }
  return store;
}

absl::Status CalibrationStore::Load() {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    if (!e.is_regular_file()) continue;
    if (e.path().extension() == kSuffix) files.push_back(e.path());
    // A write a crash cut short (WriteDurably's temporary file): never renamed into place.
    const std::string name = e.path().filename().string();
    if (name.size() > 5 && name[0] == '.' && name.ends_with(".tmp")) {
      std::error_code gone;
      std::filesystem::remove(e.path(), gone);
    }
  }
  if (ec)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the calibration directory ", dir_, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  absl::MutexLock lock(&mu_);
  for (const auto& path : files) {
    const std::string name = path.filename().string();
    absl::Status why;
    auto ns = Digest::FromHex(name.substr(0, 64));
    if (!ns.ok() || name.size() != 64 + 1 + 16 + kSuffixBytes || name[64] != '-') {
      why = absl::InvalidArgumentError("the name is not NAMESPACE-ID.skvp");
    } else {
      std::ifstream in(path, std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      auto r = DescribeCalibration(*ns, bytes.str());
      if (!r.ok()) {
        why = r.status();
      } else if (FileName(*ns, r->id) != name) {
        why = absl::DataLossError("its bytes hash to another id than its name says");
      } else if (HasVersion(*ns, r->version)) {
        // Left by a crash between two Puts of one version (the second removes its file once
        // refused): the first in name order stays, as every later Put of the version is refused.
        why = absl::FailedPreconditionError(
            absl::StrCat("the namespace has another calibration of version ", r->version));
      } else {
        struct stat st;
        if (::stat(path.c_str(), &st) == 0) r->added = absl::TimeFromTimespec(st.st_mtim);
        Insert(std::move(*r));
        continue;
      }
    }
    ++rejected_files_;
    std::filesystem::rename(path, path.string() + ".bad", ec);
    spdlog::warn("calibration file {} set aside as {}.bad: {}", path.string(), path.string(),
                 std::string(why.message()));
  }
  if (count_ > 0) spdlog::info("loaded {} calibrations ({} bytes) from {}", count_, bytes_, dir_);
  return absl::OkStatus();
}

bool CalibrationStore::HasVersion(const NamespaceId& ns, uint32_t version) const {
  auto it = by_ns_.find(ns);
  if (it == by_ns_.end()) return false;
  for (const CalibrationRecord& r : it->second)
    if (r.version == version) return true;
  return false;
}

void CalibrationStore::Insert(CalibrationRecord r) {
  bytes_ += r.artefact->size();
  ++count_;
  auto& list = by_ns_[r.ns];
  auto at = std::upper_bound(list.begin(), list.end(), r.version,
                             [](uint32_t v, const CalibrationRecord& x) { return v < x.version; });
  list.insert(at, std::move(r));
}

absl::Status CalibrationStore::WriteFile(const CalibrationRecord& r) const {
  if (dir_.empty()) return absl::OkStatus();
  return WriteDurably(dir_, FileName(r.ns, r.id), *r.artefact);
}

absl::StatusOr<CalibrationRecord> CalibrationStore::Put(
    const NamespaceId& ns, std::string artefact,
    const std::function<absl::Status(const codec::Calibration&)>& check) {
  codec::Calibration parsed;
  auto described = DescribeCalibration(ns, std::move(artefact), check ? &parsed : nullptr);
  if (!described.ok()) return described.status();
  if (check) STRATA_RETURN_IF_ERROR(check(parsed));
  CalibrationRecord r = std::move(*described);
  // Checked before and after the (slow, unlocked) file write: readers are not held up by it.
  auto admit = [&]() -> absl::StatusOr<std::optional<CalibrationRecord>> {
    mu_.AssertHeld();
    auto it = by_ns_.find(ns);
    if (it != by_ns_.end()) {
      for (const CalibrationRecord& x : it->second) {
        if (x.id == r.id) return std::optional<CalibrationRecord>(x);
        if (x.version == r.version)
          return absl::FailedPreconditionError(absl::StrCat(
              "namespace ", ns.ShortHex(), " already has calibration version ", r.version, " (id ",
              codec::CalibrationIdString(x.id), "); give the new one a higher version"));
      }
      if (it->second.size() >= limits_.max_per_namespace)
        return absl::ResourceExhaustedError(absl::StrCat(
            "namespace ", ns.ShortHex(), " holds ", it->second.size(),
            " calibrations (limits.max_calibrations_per_namespace)"));
    }
    if (bytes_ + r.artefact->size() > limits_.max_bytes)
      return absl::ResourceExhaustedError(
          absl::StrCat("calibrations would take ", bytes_ + r.artefact->size(), " bytes (limit ",
                       limits_.max_bytes, ", limits.calibration_bytes)"));
    return std::optional<CalibrationRecord>();
  };
  const auto key = std::make_pair(ns, r.version);
  {
    absl::MutexLock lock(&mu_);
    auto admitted = admit();
    if (!admitted.ok()) return admitted.status();
    if (*admitted) return **admitted;
    Writing& w = writing_[key];
    if (w.writers > 0 && w.id != r.id)
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace ", ns.ShortHex(), " is storing another calibration of version ", r.version,
          " (id ", codec::CalibrationIdString(w.id), "); give the new one a higher version"));
    w.id = r.id;
    ++w.writers;
  }
  const absl::Status written = WriteFile(r);
  absl::MutexLock lock(&mu_);
  if (--writing_[key].writers == 0) writing_.erase(key);
  if (!written.ok()) return written;
  auto admitted = admit();
  if (admitted.ok() && !*admitted) {
    Insert(r);
    return r;
  }
  if (admitted.ok()) return **admitted;  // a concurrent Put of the same artefact won
  // Lost a race with another artefact of the same version: the file is not ours to keep.
  std::error_code ec;
  if (!dir_.empty())
    std::filesystem::remove(absl::StrCat(dir_, "/", FileName(r.ns, r.id)), ec);
  return admitted.status();
}

absl::StatusOr<CalibrationRecord> CalibrationStore::Get(const NamespaceId& ns, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_ns_.find(ns);
  if (it != by_ns_.end() && !it->second.empty()) {
    if (id == 0) return it->second.back();
    for (const CalibrationRecord& r : it->second)
      if (r.id == id) return r;
  }
  if (id == 0)
    return absl::NotFoundError(absl::StrCat("namespace ", ns.ShortHex(), " has no calibration"));
  return absl::NotFoundError(absl::StrCat("namespace ", ns.ShortHex(), " has no calibration ",
                                          codec::CalibrationIdString(id)));
}

absl::StatusOr<std::shared_ptr<const codec::Calibration>> CalibrationStore::Parsed(
    const NamespaceId& ns, uint64_t id) const {
  // The namespace's own record first: a blob of one namespace never borrows another's
  // calibration through the shared cache.
  STRATA_ASSIGN_OR_RETURN(CalibrationRecord r, Get(ns, id));
  if (auto held = parsed_.Find(r.id)) return held;
  const std::string& bytes = *r.artefact;
  auto parsed = codec::Calibration::Parse(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  if (!parsed.ok()) return parsed.status();
  // What the set holds under the id (another caller's copy, if it got there first): the pin.
  return parsed_.Insert(std::make_shared<const codec::Calibration>(*std::move(parsed)));
}

std::vector<CalibrationRecord> CalibrationStore::List(std::optional<NamespaceId> ns) const {
  std::vector<CalibrationRecord> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, list] : by_ns_)
    if (!ns || id == *ns) out.insert(out.end(), list.begin(), list.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.ns != b.ns ? a.ns < b.ns : a.version < b.version;
  });
  return out;
}

bool CalibrationStore::IsCurrent(const NamespaceId& ns, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_ns_.find(ns);
  return it != by_ns_.end() && !it->second.empty() && it->second.back().id == id;
}

size_t CalibrationStore::size() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

uint64_t CalibrationStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace strata::daemon
