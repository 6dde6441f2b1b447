// The `strata._strata` extension: strata::Client for Python. Buffers come from anything with the
// buffer protocol (numpy, bytearray, memoryview), anything with __dlpack__ (torch tensors on the
// CPU), or an (address, nbytes) pair; none is copied. The GIL is released while a call waits on
// the daemon or moves bytes. Errors raise the strata.errors class named after the status code,
// carrying the daemon's message; per-block outcomes stay per block.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/block_id.h"
#include "strata/client.h"
#include "strata/vllm_ids.h"

namespace py = pybind11;

namespace {

using strata::BlockId;
using strata::BlockStatus;
using strata::NamespaceId;

[[noreturn]] void Raise(const absl::Status& status) {
  py::object errors = py::module_::import("strata.errors");
  py::object cls = errors.attr("error_class")(absl::StatusCodeToString(status.code()));
  std::string message(status.message());
  if (message.empty()) message = absl::StatusCodeToString(status.code());
  PyErr_SetString(cls.ptr(), message.c_str());
  throw py::error_already_set();
}

template <typename T>
T Take(absl::StatusOr<T> r) {
  if (!r.ok()) Raise(r.status());
  return *std::move(r);
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

[[noreturn]] void InvalidArgument(const std::string& what) {
  Raise(absl::InvalidArgumentError(what));
}

// Thrown where the GIL may not be held (Raise needs it): the module's translator raises
// strata.errors.FailedPreconditionError for it once pybind11 holds the GIL again.
struct ClientClosed : std::exception {
  const char* what() const noexcept override { return "the client is closed"; }
};

// Ids travel as 32-byte `bytes`.
BlockId IdFrom(py::handle h) {
  if (!py::isinstance<py::bytes>(h)) InvalidArgument("a block or namespace id must be 32 bytes");
  std::string_view raw = h.cast<std::string_view>();
  auto id = strata::Digest::FromBytes(raw);
  if (!id.ok()) InvalidArgument(std::string(id.status().message()));
  return *id;
}

std::vector<BlockId> IdsFrom(const py::sequence& seq) {
  std::vector<BlockId> ids;
  ids.reserve(seq.size());
  for (py::handle h : seq) ids.push_back(IdFrom(h));
  return ids;
}

py::bytes IdTo(const BlockId& id) { return py::bytes(std::string(id.AsBytes())); }

py::list IdsTo(const std::vector<BlockId>& ids) {
  py::list out;
  for (const BlockId& id : ids) out.append(IdTo(id));
  return out;
}

std::vector<uint32_t> TokensFrom(const py::handle& tokens) {
  std::vector<uint32_t> out;
  for (py::handle t : tokens) {
    long long v = t.cast<long long>();
    if (v < 0 || v > 0xffffffffLL) InvalidArgument("token ids must fit in 32 bits unsigned");
    out.push_back(static_cast<uint32_t>(v));
  }
  return out;
}

// --- Buffers -------------------------------------------------------------------------------

// DLPack's C ABI (dlpack.h, the unversioned "dltensor" capsule every producer still offers).
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1, kDLCUDAHost = 3;

// One caller buffer, viewed in place for the duration of a call (or of a registration).
class BufferView {
 public:
  BufferView(py::handle obj, bool writable) {
    if (PyObject_CheckBuffer(obj.ptr())) {
      int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
      if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
        PyErr_Clear();
        InvalidArgument(writable ? "a destination buffer must be writable and C-contiguous"
                                 : "a source buffer must be C-contiguous");
      }
      has_view_ = true;
      data_ = view_.buf;
      size_ = static_cast<size_t>(view_.len);
    } else if (py::hasattr(obj, "__dlpack__")) {
      FromDlpack(obj);
    } else if (py::isinstance<py::tuple>(obj) && py::len(obj) == 2) {
      auto pair = obj.cast<std::pair<uintptr_t, size_t>>();
      data_ = reinterpret_cast<void*>(pair.first);
      size_ = pair.second;
    } else {
      InvalidArgument(
          "a buffer must support the buffer protocol or __dlpack__, or be an (address, nbytes) "
          "tuple");
    }
  }
  BufferView(BufferView&& o) noexcept { *this = std::move(o); }
  BufferView& operator=(BufferView&& o) noexcept {
    std::swap(view_, o.view_);
    std::swap(has_view_, o.has_view_);
    std::swap(capsule_, o.capsule_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~BufferView() {
    if (has_view_) PyBuffer_Release(&view_);
  }

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void FromDlpack(py::handle obj) {
    capsule_ = obj.attr("__dlpack__")();
    auto* managed =
        static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
    if (managed == nullptr) {
      PyErr_Clear();
      InvalidArgument("__dlpack__ did not return a 'dltensor' capsule");
    }
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
      InvalidArgument("a tensor buffer must be in host memory (move it to the CPU first)");
    uint64_t elements = 1, expected_stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.strides != nullptr && t.shape[d] > 1 &&
          static_cast<uint64_t>(t.strides[d]) != expected_stride)
        InvalidArgument("a tensor buffer must be contiguous (call .contiguous())");
      expected_stride *= static_cast<uint64_t>(t.shape[d]);
      elements *= static_cast<uint64_t>(t.shape[d]);
    }
    data_ = static_cast<uint8_t*>(t.data) + t.byte_offset;
    size_ = elements * t.dtype.lanes * ((t.dtype.bits + 7) / 8);
    // The capsule stays unconsumed: its destructor frees the DLManagedTensor, and holding the
    // capsule keeps the tensor's storage alive while the view is in use.
  }

  Py_buffer view_{};
  bool has_view_ = false;
  py::object capsule_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

std::vector<BufferView> ViewsFrom(const py::sequence& seq, bool writable) {
  std::vector<BufferView> views;
  views.reserve(seq.size());
  for (py::handle h : seq) views.emplace_back(h, writable);
  return views;
}

// --- Results -------------------------------------------------------------------------------

struct PyPublishResult {
  std::vector<BlockStatus> status;
  size_t stored = 0;
  size_t deduplicated = 0;
  uint64_t bytes_sent = 0;
  py::list ids;
};

struct PyLookupResult {
  size_t prefix_blocks = 0;
  size_t prefix_tokens = 0;
  py::list ids;
  std::vector<std::string> nodes;
};

struct PyFetchResult {
  std::vector<BlockStatus> status;
  std::vector<uint64_t> sizes;
  size_t fetched = 0;
  uint64_t bytes_received = 0;
  size_t remote = 0;
};

// --- Device buffers (docs/gpu.md) ----------------------------------------------------------

// strata.StandInDeviceBuffer: host memory standing in for an engine's device buffer where the
// daemon's GPU tier is host memory too; a writable Python buffer.
struct PyStandInDeviceBuffer {
  std::shared_ptr<strata::StandInDeviceBuffer> buffer;
};

// A loan of a device buffer to the daemon; keeps the lent object alive while it is out.
struct PyDeviceLoan {
  uint64_t id = 0;
  py::object lent;
};

struct PyDeviceFetchResult {
  std::vector<BlockStatus> status;
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> crcs;
  std::vector<std::string> sources;
  size_t fetched = 0;
  uint64_t bytes = 0;
};

// The parents a publish names, or by default a chain: each block's parent the one before it,
// the first a root.
std::vector<BlockId> ParentsOf(const std::optional<py::sequence>& parents,
                               const std::vector<BlockId>& ids) {
  if (parents) return IdsFrom(*parents);
  std::vector<BlockId> chain(ids.size());
  for (size_t i = 1; i < ids.size(); ++i) chain[i] = ids[i - 1];
  return chain;
}

struct PyDevicePublishResult {
  std::vector<BlockStatus> status;
  std::vector<uint64_t> stored_bytes;
  size_t stored = 0;
  uint64_t bytes_read = 0;
  bool encoded_on_device = false;
};

// The handle of what an engine lends: a StandInDeviceBuffer, an object with
// __cuda_array_interface__ (a CUDA tensor, contiguous), or a device pointer (int) with nbytes.
strata::DeviceBufferHandle DeviceHandleOf(const py::object& obj, uint64_t nbytes) {
  if (py::isinstance<PyStandInDeviceBuffer>(obj))
    return obj.cast<PyStandInDeviceBuffer&>().buffer->handle();
  uint64_t ptr = 0, size = nbytes;
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    py::dict cai = obj.attr("__cuda_array_interface__");
    ptr = cai["data"].cast<py::tuple>()[0].cast<uint64_t>();
    if (!cai.contains("strides") || !cai["strides"].is_none())
      InvalidArgument("a lent device tensor must be contiguous (call .contiguous())");
    const std::string typestr = cai["typestr"].cast<std::string>();
    uint64_t elements = 1;
    for (py::handle d : cai["shape"].cast<py::tuple>()) elements *= d.cast<uint64_t>();
    size = elements * std::stoull(typestr.substr(2));
    if (nbytes != 0 && nbytes != size) InvalidArgument("nbytes does not match the tensor's size");
  } else if (py::isinstance<py::int_>(obj)) {
    ptr = obj.cast<uint64_t>();
    if (nbytes == 0) InvalidArgument("a device pointer needs nbytes");
  } else {
    InvalidArgument(
        "lend a StandInDeviceBuffer, a CUDA tensor (__cuda_array_interface__) or a device "
        "pointer with nbytes");
  }
  absl::StatusOr<strata::DeviceBufferHandle> h;
  {
    py::gil_scoped_release release;
    h = strata::ExportCudaBuffer(reinterpret_cast<const void*>(ptr), size);
  }
  return Take(std::move(h));
}

// --- Client --------------------------------------------------------------------------------

// A publish buffer as a writable Python buffer (numpy.frombuffer, memoryview): it keeps the
// client whose memory it is alive.
struct PyPublishBuffer {
  std::shared_ptr<strata::Client> owner;
  uint8_t* data = nullptr;
  size_t size = 0;
};

class PyClient {
 public:
  explicit PyClient(const strata::ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<strata::Client>> c;
    {
      py::gil_scoped_release release;
      c = strata::Client::Connect(options);
    }
    client_ = Take(std::move(c));
  }

  // The client for one call, kept alive until the call ends even if another thread closes it
  // meanwhile. Called with or without the GIL: ClientClosed once closed.
  std::shared_ptr<strata::Client> client() {
    std::lock_guard<std::mutex> lock(client_mu_);
    if (!client_) throw ClientClosed();
    return client_;
  }

  // Memory the engine writes blocks into and publishes from (Client::AllocatePublishBuffer):
  // with several tenants on this node the daemon copies those blocks straight into the tenant's
  // zone, without this client's copy.
  PyPublishBuffer AllocatePublishBuffer(size_t nbytes) {
    std::shared_ptr<strata::Client> c = client();
    absl::StatusOr<strata::MutableBuffer> b;
    {
      py::gil_scoped_release release;
      b = c->AllocatePublishBuffer(nbytes);
    }
    strata::MutableBuffer buf = Take(std::move(b));
    return PyPublishBuffer{c, static_cast<uint8_t*>(buf.data), buf.size};
  }

  // Lends the daemon a buffer of this process's device memory (Client::LendDeviceBuffer).
  PyDeviceLoan LendDeviceBuffer(py::object buffer, uint64_t nbytes) {
    strata::DeviceBufferHandle h = DeviceHandleOf(buffer, nbytes);
    absl::StatusOr<uint64_t> id;
    {
      py::gil_scoped_release release;
      id = client()->LendDeviceBuffer(h);
    }
    return PyDeviceLoan{Take(std::move(id)), std::move(buffer)};
  }

  PyDeviceFetchResult FetchToDevice(py::bytes ns, const PyDeviceLoan& loan, py::sequence ids,
                                    std::vector<uint64_t> offsets, bool promote, bool decode) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    absl::StatusOr<strata::DeviceFetchResult> r;
    {
      py::gil_scoped_release release;
      r = client()->FetchToDevice(id, loan.id, block_ids, offsets, {promote, decode});
    }
    strata::DeviceFetchResult f = Take(std::move(r));
    return {f.status, f.sizes, f.crcs, f.sources, f.fetched, f.bytes};
  }

  PyDevicePublishResult PublishFromDevice(py::bytes ns, const PyDeviceLoan& loan,
                                          py::sequence ids, std::vector<uint64_t> offsets,
                                          std::vector<uint64_t> sizes,
                                          std::optional<py::sequence> parents) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    std::vector<BlockId> parent_ids = ParentsOf(parents, block_ids);
    absl::StatusOr<strata::DevicePublishResult> r;
    {
      py::gil_scoped_release release;
      r = client()->PublishFromDevice(id, loan.id, block_ids, parent_ids, offsets, sizes);
    }
    strata::DevicePublishResult p = Take(std::move(r));
    return {p.status, p.stored_bytes, p.stored, p.bytes_read, p.encoded_on_device};
  }

  void ReturnDeviceBuffer(const PyDeviceLoan& loan) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client()->ReturnDeviceBuffer(loan.id);
    }
    Check(s);
  }

  void Close() {
    registered_.clear();
    std::shared_ptr<strata::Client> closing;
    {
      std::lock_guard<std::mutex> lock(client_mu_);
      closing.swap(client_);
    }
    py::gil_scoped_release release;
    closing.reset();  // the last call still running, if any, ends the client
  }

  py::bytes OpenNamespace(const std::string& model_id, uint32_t num_layers, uint32_t num_kv_heads,
                          uint32_t head_dim, const std::string& dtype, uint32_t tokens_per_block,
                          const std::string& tenant, const std::string& revision,
                          const std::string& kind, uint32_t tp_rank, uint32_t tp_size,
                          const std::string& lora_id, const std::string& codec,
                          const std::string& id_scheme, uint32_t replicas,
                          const std::string& cold_codec) {
    strata::NamespaceSpec spec;
    spec.model_id = model_id;
    spec.model_revision = revision;
    spec.layout.num_layers = num_layers;
    spec.layout.num_kv_heads = num_kv_heads;
    spec.layout.head_dim = head_dim;
    spec.layout.dtype = Take(strata::ParseDType(dtype));
    spec.layout.tokens_per_block = tokens_per_block;
    if (kind == "kv")
      spec.layout.kind = strata::KvKind::kSeparateKV;
    else if (kind == "mla")
      spec.layout.kind = strata::KvKind::kMlaLatent;
    else
      InvalidArgument("kind must be 'kv' or 'mla', not '" + kind + "'");
    spec.tp_rank = tp_rank;
    spec.tp_size = tp_size;
    spec.lora_id = lora_id;
    spec.codec_policy = codec;
    spec.id_scheme = Take(strata::ParseIdScheme(id_scheme));
    strata::NamespaceOptions options;
    options.replicas = replicas;
    options.cold_codec = cold_codec;
    absl::StatusOr<NamespaceId> ns;
    {
      py::gil_scoped_release release;
      ns = client()->OpenNamespace(spec, tenant, options);
    }
    return IdTo(Take(std::move(ns)));
  }

  // Registers the buffer for zero-copy transfers and keeps the object alive until unregistered.
  void Register(py::object obj) {
    BufferView view(obj, /*writable=*/false);
    void* data = view.data();
    size_t size = view.size();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client()->RegisterBuffer(data, size);
    }
    Check(s);
    registered_.push_back({data, std::move(obj), std::make_shared<BufferView>(std::move(view))});
  }

  void Unregister(py::object obj) {
    BufferView view(obj, /*writable=*/false);
    void* data = view.data();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client()->UnregisterBuffer(data);
    }
    Check(s);
    std::erase_if(registered_, [&](const Registered& r) { return r.data == data; });
  }

  py::list BlockIds(py::bytes ns, py::handle tokens, const std::string& cache_salt) {
    return IdsTo(Take(client()->BlockIds(IdFrom(ns), TokensFrom(tokens), cache_salt)));
  }

  PyPublishResult Publish(py::bytes ns, py::handle tokens, py::sequence blocks) {
    NamespaceId id = IdFrom(ns);
    std::vector<uint32_t> toks = TokensFrom(tokens);
    std::vector<BufferView> views = ViewsFrom(blocks, false);
    std::vector<strata::ConstBuffer> bufs;
    for (const BufferView& v : views) bufs.push_back({v.data(), v.size()});
    absl::StatusOr<strata::PublishResult> r;
    {
      py::gil_scoped_release release;
      r = client()->Publish(id, toks, bufs);
    }
    return ToPy(Take(std::move(r)));
  }

  PyPublishResult PublishIds(py::bytes ns, py::sequence ids, py::sequence blocks,
                             std::optional<py::sequence> parents,
                             std::optional<std::vector<uint64_t>> first_positions) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    std::vector<BlockId> parent_ids = ParentsOf(parents, block_ids);
    std::vector<BufferView> views = ViewsFrom(blocks, false);
    std::vector<strata::ConstBuffer> bufs;
    for (const BufferView& v : views) bufs.push_back({v.data(), v.size()});
    absl::StatusOr<strata::PublishResult> r;
    {
      py::gil_scoped_release release;
      r = client()->PublishIds(id, block_ids, parent_ids, bufs,
                               first_positions ? std::span<const uint64_t>(*first_positions)
                                               : std::span<const uint64_t>());
    }
    return ToPy(Take(std::move(r)));
  }

  PyLookupResult Lookup(py::bytes ns, py::handle tokens) {
    NamespaceId id = IdFrom(ns);
    std::vector<uint32_t> toks = TokensFrom(tokens);
    absl::StatusOr<strata::LookupResult> r;
    {
      py::gil_scoped_release release;
      r = client()->Lookup(id, toks);
    }
    strata::LookupResult found = Take(std::move(r));
    PyLookupResult out;
    out.prefix_blocks = found.prefix_blocks;
    out.prefix_tokens = found.prefix_tokens;
    out.ids = IdsTo(found.ids);
    out.nodes = found.nodes;
    return out;
  }

  size_t LookupIds(py::bytes ns, py::sequence ids) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    absl::StatusOr<size_t> r;
    {
      py::gil_scoped_release release;
      r = client()->LookupIds(id, block_ids);
    }
    return Take(std::move(r));
  }

  PyFetchResult Fetch(py::bytes ns, py::sequence ids, py::sequence buffers) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    std::vector<BufferView> views = ViewsFrom(buffers, true);
    std::vector<strata::MutableBuffer> bufs;
    for (const BufferView& v : views) bufs.push_back({v.data(), v.size()});
    absl::StatusOr<strata::FetchResult> r;
    {
      py::gil_scoped_release release;
      r = client()->Fetch(id, block_ids, bufs);
    }
    strata::FetchResult f = Take(std::move(r));
    return {f.status, f.sizes, f.fetched, f.bytes_received, f.remote};
  }

  std::vector<BlockStatus> Evict(py::bytes ns, py::sequence ids, bool cascade, bool force) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    absl::StatusOr<strata::EvictOutcome> r;
    {
      py::gil_scoped_release release;
      r = client()->Evict(id, block_ids, cascade, force);
    }
    return Take(std::move(r)).status;
  }

  py::dict Reposition(py::bytes ns, py::sequence ids, const std::string& target_node, bool move,
                      const std::string& target_tier) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    absl::StatusOr<strata::RepositionOutcome> r;
    {
      py::gil_scoped_release release;
      r = client()->Reposition(id, block_ids, target_node, move, target_tier);
    }
    strata::RepositionOutcome out = Take(std::move(r));
    py::dict d;
    d["status"] = out.status;
    d["copied"] = out.copied;
    d["already_there"] = out.already_there;
    d["removed_sources"] = out.removed_sources;
    return d;
  }

  std::vector<BlockStatus> Pin(py::bytes ns, py::sequence ids, double ttl_seconds) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    absl::StatusOr<std::vector<BlockStatus>> r;
    {
      py::gil_scoped_release release;
      r = client()->Pin(id, block_ids, absl::Seconds(ttl_seconds));
    }
    return Take(std::move(r));
  }

  std::vector<BlockStatus> Unpin(py::bytes ns, py::sequence ids) {
    NamespaceId id = IdFrom(ns);
    std::vector<BlockId> block_ids = IdsFrom(ids);
    absl::StatusOr<std::vector<BlockStatus>> r;
    {
      py::gil_scoped_release release;
      r = client()->Unpin(id, block_ids);
    }
    return Take(std::move(r));
  }

  py::dict Stats() {
    absl::StatusOr<strata::DaemonStats> r;
    {
      py::gil_scoped_release release;
      r = client()->Stats();
    }
    strata::DaemonStats s = Take(std::move(r));
    py::dict d;
    d["node_id"] = s.node_id;
    d["version"] = s.version;
    d["uptime_ms"] = s.uptime_ms;
    d["host_capacity_bytes"] = s.host_capacity_bytes;
    d["host_used_bytes"] = s.host_used_bytes;
    d["host_blocks"] = s.host_blocks;
    d["open_reservations"] = s.open_reservations;
    d["open_leases"] = s.open_leases;
    d["pinned_blocks"] = s.pinned_blocks;
    d["namespaces"] = s.namespaces;
    d["transport"] = s.transport;
    py::dict counters;
    for (const auto& [name, value] : s.counters) counters[py::str(name)] = value;
    d["counters"] = counters;
    return d;
  }

  py::dict CalibrationCacheStats() {
    const strata::CalibrationCacheStats s = client()->calibration_cache_stats();
    py::dict d;
    d["calibrations"] = s.calibrations;
    d["bytes"] = s.bytes;
    d["budget_bytes"] = s.budget_bytes;
    d["evictions"] = s.evictions;
    d["fetches"] = s.fetches;
    return d;
  }

  // Calibrates a pca or xl namespace from sample blocks (docs/codec.md, "Calibrations in the
  // cluster").
  py::dict Calibrate(py::bytes ns, py::sequence samples, double bits_per_value, double rope_theta,
                     std::optional<std::vector<uint64_t>> first_positions,
                     std::optional<std::vector<double>> importance, double step) {
    NamespaceId id = IdFrom(ns);
    std::vector<BufferView> views = ViewsFrom(samples, false);
    std::vector<strata::ConstBuffer> bufs;
    for (const BufferView& v : views) bufs.push_back({v.data(), v.size()});
    strata::CalibrationRequest req;
    req.bits_per_value = bits_per_value;
    req.step = step;
    req.rope_theta = rope_theta;
    if (first_positions) req.first_positions = *first_positions;
    if (importance) req.importance = *importance;
    absl::StatusOr<strata::CalibrationInfo> r;
    {
      py::gil_scoped_release release;
      r = client()->Calibrate(id, bufs, req);
    }
    return CalibrationDict(Take(std::move(r)));
  }

  py::list ListCalibrations(py::bytes ns) {
    NamespaceId id = IdFrom(ns);
    absl::StatusOr<std::vector<strata::CalibrationInfo>> r;
    {
      py::gil_scoped_release release;
      r = client()->ListCalibrations(id);
    }
    py::list out;
    for (const auto& c : Take(std::move(r))) out.append(CalibrationDict(c));
    return out;
  }

  std::string NodeId() { return client()->node_id(); }
  uint32_t TokensPerBlock(py::bytes ns) { return client()->tokens_per_block(IdFrom(ns)); }

 private:
  static py::dict CalibrationDict(const strata::CalibrationInfo& c) {
    py::dict d;
    d["id"] = c.id;
    d["version"] = c.version;
    d["bytes"] = c.bytes;
    d["target_bits"] = c.target_bits;
    d["sample_bits"] = c.sample_bits;
    d["rope_theta"] = c.rope_theta;
    d["mode"] = c.mode;
    d["step"] = c.step;
    d["current"] = c.current;
    d["replicated_to"] = c.replicated_to;
    return d;
  }

  PyPublishResult ToPy(const strata::PublishResult& r) {
    return {r.status, r.stored, r.deduplicated, r.bytes_sent, IdsTo(r.ids)};
  }

  struct Registered {
    void* data;
    py::object owner;
    std::shared_ptr<BufferView> view;
  };
  std::vector<Registered> registered_;
  // Shared with the publish buffers handed out: their memory is the client's, so a closed
  // client lives on until the last of them is gone.
  std::mutex client_mu_;
  std::shared_ptr<strata::Client> client_;  // guarded by client_mu_
};

}  // namespace

PYBIND11_MODULE(_strata, m) {
  m.doc() = "libstrata: publish, look up and fetch KV-cache blocks on a stratad";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ClientClosed&) {
      try {
        Raise(absl::FailedPreconditionError("the client is closed"));
      } catch (py::error_already_set& e) {
        e.restore();
      }
    }
  });

  py::enum_<BlockStatus>(m, "BlockStatus")
      .value("OK", BlockStatus::kOk)
      .value("NOT_FOUND", BlockStatus::kNotFound)
      .value("EXISTS", BlockStatus::kExists)
      .value("IN_PROGRESS", BlockStatus::kInProgress)
      .value("NO_SPACE", BlockStatus::kNoSpace)
      .value("CRC_MISMATCH", BlockStatus::kCrcMismatch)
      .value("PINNED", BlockStatus::kPinned)
      .value("INVALID", BlockStatus::kInvalid)
      .value("EXPIRED", BlockStatus::kExpired)
      .value("UNKNOWN_CALIBRATION", BlockStatus::kUnknownCalibration);

  py::class_<PyPublishResult>(m, "PublishResult")
      .def_readonly("status", &PyPublishResult::status)
      .def_readonly("stored", &PyPublishResult::stored)
      .def_readonly("deduplicated", &PyPublishResult::deduplicated)
      .def_readonly("bytes_sent", &PyPublishResult::bytes_sent)
      .def_readonly("ids", &PyPublishResult::ids);
  py::class_<PyLookupResult>(m, "LookupResult")
      .def_readonly("prefix_blocks", &PyLookupResult::prefix_blocks)
      .def_readonly("prefix_tokens", &PyLookupResult::prefix_tokens)
      .def_readonly("ids", &PyLookupResult::ids)
      .def_readonly("nodes", &PyLookupResult::nodes);
  py::class_<PyFetchResult>(m, "FetchResult")
      .def_readonly("status", &PyFetchResult::status)
      .def_readonly("sizes", &PyFetchResult::sizes)
      .def_readonly("fetched", &PyFetchResult::fetched)
      .def_readonly("bytes_received", &PyFetchResult::bytes_received)
      .def_readonly("remote", &PyFetchResult::remote);

  py::class_<PyPublishBuffer>(m, "PublishBuffer", py::buffer_protocol())
      .def_buffer([](PyPublishBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {1});
      })
      .def("__len__", [](const PyPublishBuffer& b) { return b.size; });

  py::class_<PyStandInDeviceBuffer>(m, "StandInDeviceBuffer", py::buffer_protocol())
      .def(py::init([](size_t nbytes) {
             return PyStandInDeviceBuffer{Take(strata::StandInDeviceBuffer::Create(nbytes))};
           }),
           py::arg("nbytes"))
      .def_buffer([](PyStandInDeviceBuffer& b) {
        return py::buffer_info(b.buffer->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.buffer->size())}, {1});
      })
      .def("__len__", [](const PyStandInDeviceBuffer& b) { return b.buffer->size(); });
  py::class_<PyDeviceLoan>(m, "DeviceLoan")
      .def_readonly("id", &PyDeviceLoan::id)
      .def_readonly("lent", &PyDeviceLoan::lent);
  py::class_<PyDevicePublishResult>(m, "DevicePublishResult")
      .def_readonly("status", &PyDevicePublishResult::status)
      .def_readonly("stored_bytes", &PyDevicePublishResult::stored_bytes)
      .def_readonly("stored", &PyDevicePublishResult::stored)
      .def_readonly("bytes_read", &PyDevicePublishResult::bytes_read)
      .def_readonly("encoded_on_device", &PyDevicePublishResult::encoded_on_device);
  py::class_<PyDeviceFetchResult>(m, "DeviceFetchResult")
      .def_readonly("status", &PyDeviceFetchResult::status)
      .def_readonly("sizes", &PyDeviceFetchResult::sizes)
      .def_readonly("crcs", &PyDeviceFetchResult::crcs)
      .def_readonly("sources", &PyDeviceFetchResult::sources)
      .def_readonly("fetched", &PyDeviceFetchResult::fetched)
      .def_readonly("bytes", &PyDeviceFetchResult::bytes);

  py::class_<PyClient>(m, "Client")
      .def(py::init([](const std::string& endpoint, const std::string& client_name,
                       double rpc_timeout, double transfer_timeout, bool verify_crc,
                       bool remote_fetch, bool lookup_fast_path, const std::string& fetch_transfer,
                       bool same_node, const std::string& vllm_hash_seed, bool quiet,
                       const std::string& auth_token, const std::string& tls_ca_file,
                       const std::string& tls_cert_file, const std::string& tls_key_file,
                       const std::string& tls_server_name, bool fetch_bypasses_cache,
                       uint64_t calibration_cache_bytes) {
             strata::ClientOptions o;
             o.endpoint = endpoint;
             o.client_name = client_name;
             o.auth_token = auth_token;
             o.tls.ca_file = tls_ca_file;
             o.tls.cert_file = tls_cert_file;
             o.tls.key_file = tls_key_file;
             o.tls.server_name = tls_server_name;
             o.rpc_timeout = absl::Seconds(rpc_timeout);
             o.transfer_timeout = absl::Seconds(transfer_timeout);
             o.verify_crc = verify_crc;
             o.remote_fetch = remote_fetch;
             o.lookup_fast_path = lookup_fast_path;
             o.fetch_transfer = fetch_transfer;
             o.same_node = same_node;
             o.fetch_bypasses_cache = fetch_bypasses_cache;
             o.calibration_cache_bytes = calibration_cache_bytes;
             o.vllm_hash_seed = vllm_hash_seed;
             if (quiet) o.log = [](strata::LogLevel, std::string_view) {};
             return std::make_unique<PyClient>(o);
           }),
           py::arg("endpoint") = "127.0.0.1:7420", py::arg("client_name") = "strata-python",
           py::arg("rpc_timeout") = 5.0, py::arg("transfer_timeout") = 10.0,
           py::arg("verify_crc") = true, py::arg("remote_fetch") = true,
           py::arg("lookup_fast_path") = true, py::arg("fetch_transfer") = "auto",
           py::arg("same_node") = true, py::arg("vllm_hash_seed") = "", py::arg("quiet") = false,
           py::arg("auth_token") = "", py::arg("tls_ca_file") = "", py::arg("tls_cert_file") = "",
           py::arg("tls_key_file") = "", py::arg("tls_server_name") = "",
           py::arg("fetch_bypasses_cache") = true,
           py::arg("calibration_cache_bytes") = strata::ClientOptions{}.calibration_cache_bytes)
      .def("close", &PyClient::Close)
      .def_property_readonly("node_id", &PyClient::NodeId)
      .def("tokens_per_block", &PyClient::TokensPerBlock, py::arg("ns"))
      .def("open_namespace", &PyClient::OpenNamespace, py::arg("model_id"), py::arg("num_layers"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("dtype"),
           py::arg("tokens_per_block"), py::arg("tenant"), py::arg("revision") = "",
           py::arg("kind") = "kv", py::arg("tp_rank") = 0, py::arg("tp_size") = 1,
           py::arg("lora_id") = "", py::arg("codec") = "opaque", py::arg("id_scheme") = "strata",
           py::arg("replicas") = 0, py::arg("cold_codec") = "")
      .def("allocate_publish_buffer", &PyClient::AllocatePublishBuffer, py::arg("nbytes"))
      .def("lend_device_buffer", &PyClient::LendDeviceBuffer, py::arg("buffer"),
           py::arg("nbytes") = 0)
      .def("fetch_to_device", &PyClient::FetchToDevice, py::arg("ns"), py::arg("loan"),
           py::arg("ids"), py::arg("offsets"), py::arg("promote") = true,
           py::arg("decode") = false)
      .def("publish_from_device", &PyClient::PublishFromDevice, py::arg("ns"), py::arg("loan"),
           py::arg("ids"), py::arg("offsets"), py::arg("sizes"), py::arg("parents") = py::none())
      .def("return_device_buffer", &PyClient::ReturnDeviceBuffer, py::arg("loan"))
      .def("register_buffer", &PyClient::Register, py::arg("buffer"))
      .def("unregister_buffer", &PyClient::Unregister, py::arg("buffer"))
      .def("block_ids", &PyClient::BlockIds, py::arg("ns"), py::arg("tokens"),
           py::arg("cache_salt") = "")
      .def("publish", &PyClient::Publish, py::arg("ns"), py::arg("tokens"), py::arg("blocks"))
      .def("publish_ids", &PyClient::PublishIds, py::arg("ns"), py::arg("ids"), py::arg("blocks"),
           py::arg("parents") = py::none(), py::arg("first_positions") = py::none())
      .def("calibrate", &PyClient::Calibrate, py::arg("ns"), py::arg("samples"),
           py::arg("bits_per_value") = 0.0, py::arg("rope_theta") = 0.0,
           py::arg("first_positions") = py::none(), py::arg("importance") = py::none(),
           py::arg("step") = 0.0)
      .def("list_calibrations", &PyClient::ListCalibrations, py::arg("ns"))
      .def("lookup", &PyClient::Lookup, py::arg("ns"), py::arg("tokens"))
      .def("lookup_ids", &PyClient::LookupIds, py::arg("ns"), py::arg("ids"))
      .def("fetch", &PyClient::Fetch, py::arg("ns"), py::arg("ids"), py::arg("buffers"))
      .def("evict", &PyClient::Evict, py::arg("ns"), py::arg("ids"), py::arg("cascade") = false,
           py::arg("force") = false)
      .def("reposition", &PyClient::Reposition, py::arg("ns"), py::arg("ids"),
           py::arg("target_node") = "", py::arg("move") = false, py::arg("target_tier") = "host")
      .def("pin", &PyClient::Pin, py::arg("ns"), py::arg("ids"), py::arg("ttl_seconds"))
      .def("unpin", &PyClient::Unpin, py::arg("ns"), py::arg("ids"))
      .def("stats", &PyClient::Stats)
      .def("calibration_cache_stats", &PyClient::CalibrationCacheStats);

  m.def(
      "vllm_block_hashes",
      [](py::handle tokens, uint32_t block_size, const std::string& algo,
         const std::string& hash_seed, const std::string& lora_name, const std::string& lora_path,
         const std::string& cache_salt) {
        strata::VllmHashInputs in;
        if (algo == "sha256")
          in.scheme = strata::IdScheme::kVllm;
        else if (algo == "sha256_cbor")
          in.scheme = strata::IdScheme::kVllmCbor;
        else
          InvalidArgument("algo must be 'sha256' or 'sha256_cbor', not '" + algo + "'");
        in.hash_seed = hash_seed;
        in.lora_name = lora_name;
        in.lora_path = lora_path;
        in.cache_salt = cache_salt;
        return IdsTo(strata::ComputeVllmBlockIds(block_size, TokensFrom(tokens), in));
      },
      py::arg("tokens"), py::arg("block_size"), py::arg("algo") = "sha256",
      py::arg("hash_seed") = std::string(strata::kVllmDefaultHashSeed), py::arg("lora_name") = "",
      py::arg("lora_path") = "", py::arg("cache_salt") = "",
      "Block hashes of every full block of `tokens` as vLLM computes them with "
      "prefix_caching_hash_algo=algo and PYTHONHASHSEED=hash_seed (unset: 'vllm-none-hash').");
}
