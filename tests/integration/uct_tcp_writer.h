// An attacker below UCP: it speaks UCX's tcp transport (UCT) straight to a daemon's tcp
// listening port and sends the transport's own put request, which names a raw address in the
// receiver. UCT's tcp receiver writes wherever the request says, with no key and no check, and
// whatever features the daemon's UCP context asked for: so the only defence is a daemon that
// opens no UCX tcp port. The tests use it to show that an authenticating daemon does not.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/types.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace strata::testing {

// The TCP ports `pid` listens on (IPv4), read from /proc as a local attacker could.
inline std::vector<uint16_t> ListeningPorts(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[128] = {};
      const std::string link = fd_dir + "/" + e->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n > 9 && std::strncmp(target, "socket:[", 8) == 0)
        inodes.insert(std::string(target + 8, static_cast<size_t>(n) - 9));
    }
    closedir(d);
  }
  std::vector<uint16_t> ports;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
    const size_t colon = local.find(':');
    if (colon == std::string::npos) continue;
    ports.push_back(static_cast<uint16_t>(std::stoul(local.substr(colon + 1), nullptr, 16)));
  }
  return ports;
}

class UctTcpWriter {
 public:
  UctTcpWriter() = default;
  UctTcpWriter(const UctTcpWriter&) = delete;
  UctTcpWriter& operator=(const UctTcpWriter&) = delete;
  ~UctTcpWriter() {
    if (ep_ != nullptr) uct_ep_destroy(ep_);
    if (iface_ != nullptr) uct_iface_close(iface_);
    if (worker_ != nullptr) uct_worker_destroy(worker_);
    if (async_ != nullptr) ucs_async_context_destroy(async_);
    if (md_ != nullptr) uct_md_close(md_);
    if (components_ != nullptr) uct_release_component_list(components_);
  }

  // Opens UCT's tcp transport on the first non-loopback device (the daemon's tcp interface
  // there listens on that device's address, which is also this peer's). False when none.
  bool Open() {
    unsigned count = 0;
    if (uct_query_components(&components_, &count) != UCS_OK) return false;
    for (unsigned i = 0; i < count && md_ == nullptr; ++i) {
      uct_component_attr_t attr{};
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
      if (uct_component_query(components_[i], &attr) != UCS_OK) continue;
      if (std::strcmp(attr.name, "tcp") != 0) continue;
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components_[i], nullptr, nullptr, &config) != UCS_OK) return false;
      const ucs_status_t s = uct_md_open(components_[i], "tcp", config, &md_);
      uct_config_release(config);
      if (s != UCS_OK) return false;
    }
    if (md_ == nullptr) return false;
    uct_tl_resource_desc_t* resources = nullptr;
    unsigned n = 0;
    if (uct_md_query_tl_resources(md_, &resources, &n) != UCS_OK) return false;
    std::string device;
    for (unsigned i = 0; i < n && device.empty(); ++i)
      if (std::strcmp(resources[i].dev_name, "lo") != 0) device = resources[i].dev_name;
    uct_release_tl_resource_list(resources);
    if (device.empty()) return false;
    if (ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async_) != UCS_OK) return false;
    if (uct_worker_create(async_, UCS_THREAD_MODE_SINGLE, &worker_) != UCS_OK) return false;
    uct_iface_config_t* config = nullptr;
    if (uct_md_iface_config_read(md_, "tcp", nullptr, nullptr, &config) != UCS_OK) return false;
    uct_iface_params_t p{};
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
    p.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name = "tcp";
    p.mode.device.dev_name = device.c_str();
    const ucs_status_t s = uct_iface_open(md_, worker_, &p, config, &iface_);
    uct_config_release(config);
    if (s != UCS_OK) return false;
    uct_iface_progress_enable(iface_, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_iface_attr_t attr{};
    if (uct_iface_query(iface_, &attr) != UCS_OK) return false;
    device_addr_.resize(attr.device_addr_len);
    return uct_iface_get_device_address(
               iface_, reinterpret_cast<uct_device_addr_t*>(device_addr_.data())) == UCS_OK;
  }

  // Sends one put request of `bytes` to `remote` through the daemon's tcp interface at `port`
  // and waits for the transport to report it written (or `wait` to pass). True when UCT says
  // the put completed, i.e. the receiver acknowledged it.
  bool Put(uint16_t port, const std::vector<uint8_t>& bytes, uint64_t remote,
           std::chrono::milliseconds wait = std::chrono::milliseconds(2000)) {
    if (iface_ == nullptr) return false;
    if (ep_ != nullptr) {
      uct_ep_destroy(ep_);
      ep_ = nullptr;
    }
    const uint16_t iface_addr = htons(port);
    uct_ep_params_t ep{};
    ep.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                    UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep.iface = iface_;
    ep.dev_addr = reinterpret_cast<const uct_device_addr_t*>(device_addr_.data());
    ep.iface_addr = reinterpret_cast<const uct_iface_addr_t*>(&iface_addr);
    if (uct_ep_create(&ep, &ep_) != UCS_OK) return false;
    uct_iov_t iov{};
    iov.buffer = const_cast<uint8_t*>(bytes.data());
    iov.length = bytes.size();
    iov.memh = UCT_MEM_HANDLE_NULL;
    iov.count = 1;
    Completion done;
    done.comp.func = [](uct_completion_t* c) {
      auto* d = reinterpret_cast<Completion*>(c);
      d->finished = true;
    };
    done.comp.count = 1;
    const auto stop = std::chrono::steady_clock::now() + wait;
    ucs_status_t s;
    while ((s = uct_ep_put_zcopy(ep_, &iov, 1, remote, /*rkey=*/0, &done.comp)) ==
               UCS_ERR_NO_RESOURCE &&
           std::chrono::steady_clock::now() < stop)
      uct_worker_progress(worker_);
    if (s == UCS_OK) return Flush(stop);
    if (s != UCS_INPROGRESS) return false;
    while (!done.finished && std::chrono::steady_clock::now() < stop) uct_worker_progress(worker_);
    return done.finished && done.comp.status == UCS_OK && Flush(stop);
  }

 private:
  struct Completion {
    uct_completion_t comp{};  // first: the callback casts back
    bool finished = false;
  };

  // The put is acknowledged by the receiver only once it wrote the bytes; a flush waits for
  // that acknowledgement.
  bool Flush(std::chrono::steady_clock::time_point stop) {
    ucs_status_t s;
    while ((s = uct_ep_flush(ep_, 0, nullptr)) == UCS_INPROGRESS ||
           s == UCS_ERR_NO_RESOURCE) {
      if (std::chrono::steady_clock::now() >= stop) return false;
      uct_worker_progress(worker_);
    }
    return s == UCS_OK;
  }

  uct_component_h* components_ = nullptr;
  uct_md_h md_ = nullptr;
  ucs_async_context_t* async_ = nullptr;
  uct_worker_h worker_ = nullptr;
  uct_iface_h iface_ = nullptr;
  uct_ep_h ep_ = nullptr;
  std::vector<uint8_t> device_addr_;
};

}  // namespace strata::testing
