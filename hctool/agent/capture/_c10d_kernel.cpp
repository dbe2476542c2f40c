// The c10d capture kernel in C++: how C++-issued collectives are seen without
// taking the GIL on the thread that issues them (docs/consensus.md, "Coverage").
//
// Built at run time against the torch in use (hctool/consensus/kernel_build.py) and registered at the
// Autograd key of the c10d ops in place of capture_c10d.py's Python kernel, which
// it calls for every case but one: a call on a thread that runs no Python (DDP's
// reducer on autograd's device thread) while the main thread is in a backward call
// (wrappers.py publishes that call's site). There, once the Python kernel has recorded
// a call of the same op, group, shape, dtype, reduce op and root on this thread, and
// offered its record (offer()), later calls are recorded here from that record's ids:
// the GIL, boxing into Python and the interpreter are skipped (~100-200 us a call on
// a device thread on the H200 host). The sequence numbers and ring slots are Counters,
// taken atomically by Python and by this file alike.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <unordered_set>
#include <vector>

namespace py = pybind11;

namespace {

// records.py's CALL layout ("<BBHIIIIIIiqdd8x", 64 bytes)
constexpr int64_t RECORD_SIZE = 64, PER_SEGMENT = (1 << 20) / RECORD_SIZE, T_DONE_OFFSET = 48;
constexpr int64_t MAX_SEGMENTS = 1 << 14;  // 16 GiB of ring; beyond it calls go the Python way
constexpr unsigned char KIND_CALL = 1, STATE_ENTERED = 1, STATE_COMPLETED = 2;
constexpr int MAX_DIMS = 8, MAX_OPS = 64;

// ---------------------------------------------------------------- Counter

struct CounterObject {
  PyObject_HEAD
  std::atomic<int64_t> next;
};

PyObject* counter_new(PyTypeObject* type, PyObject* args, PyObject*) {
  long long start = 0;
  if (!PyArg_ParseTuple(args, "|L", &start)) return nullptr;
  auto* self = reinterpret_cast<CounterObject*>(type->tp_alloc(type, 0));
  if (self != nullptr) new (&self->next) std::atomic<int64_t>(start);
  return reinterpret_cast<PyObject*>(self);
}

PyObject* counter_iternext(PyObject* self) {
  return PyLong_FromLongLong(reinterpret_cast<CounterObject*>(self)->next.fetch_add(1));
}

PyObject* counter_repr(PyObject* self) {
  return PyUnicode_FromFormat("Counter(%lld)", (long long)reinterpret_cast<CounterObject*>(self)->next.load());
}

PyTypeObject CounterType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------- shared state

std::atomic<unsigned char*> segments[MAX_SEGMENTS];  // ring segment base addresses, mapped lazily
std::atomic<long> backward_site{0};                  // site id of the main thread's backward call, 0: none
std::atomic<uint64_t> generation{1};                 // bumped when the recorder's tables are renewed
std::atomic<uint64_t> n_fast{0}, n_python{0};
py::object* grow_fn = nullptr;  // tracefile._grow(index) -> mmap; never freed (used until exit)
py::object* fail_fn = nullptr;  // fail(token, message): a call recorded here raised
std::unordered_set<PyObject*>* kept = nullptr;  // Counters a cache entry points into, kept alive
std::vector<PyObject*>* mapped = nullptr;         // the ring segments' mmaps, kept alive

struct OpInfo {
  c10::OperatorHandle op;
  py::object kernel;  // capture_c10d.py's kernel for this op
  int t_arg, g_arg, ro_arg, root_arg;
};
std::vector<OpInfo>* ops = nullptr;  // reserved once: entries never move

// What a call is, as far as its record goes (the thread is implied: the cache is per thread).
struct Key {
  const void* pg = nullptr;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::DeviceType device = c10::DeviceType::CPU;
  int ndim = -1;
  int64_t sizes[MAX_DIMS] = {};
  int64_t ro = -1, root = -1;
  long site = 0;
  bool operator==(const Key& o) const {
    return pg == o.pg && dtype == o.dtype && device == o.device && ndim == o.ndim && ro == o.ro &&
           root == o.root && site == o.site && std::memcmp(sizes, o.sizes, sizeof(int64_t) * ndim) == 0;
  }
};

struct Entry {
  uint64_t gen = 0;
  Key key;
  uint32_t ids[6] = {};  // op, group, site, desc, thread, reduce op: as the Python path wrote them
  int32_t root = -1;
  CounterObject *seq = nullptr, *slots = nullptr;
};

thread_local Entry cache[MAX_OPS];
thread_local bool inside = false;  // in a call recorded here: calls it makes are not user calls
thread_local int64_t offered = 0;  // what the Python kernel recorded for the call in progress
thread_local CounterObject *offered_seq = nullptr, *offered_slots = nullptr;

double monotonic() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Whether this thread is running Python code (has a frame). Read without the GIL: only this
// thread changes its own frame pointer, and it is here, in C++.
bool runs_python() {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame != nullptr;
#elif PY_VERSION_HEX >= 0x030B0000
  return ts->cframe != nullptr && ts->cframe->current_frame != nullptr;
#else
  return ts->frame != nullptr;
#endif
}

// The record of ring slot `slot`; maps its segment (taking the GIL) the first time.
unsigned char* record_at(int64_t slot) {
  int64_t index = slot / PER_SEGMENT;
  if (slot < 0 || index >= MAX_SEGMENTS) return nullptr;
  unsigned char* base = segments[index].load(std::memory_order_acquire);
  if (base == nullptr) {
    py::gil_scoped_acquire gil;
    try {
      py::object mm = (*grow_fn)(index);
      base = static_cast<unsigned char*>(py::buffer(mm).request(true).ptr);
      // Kept mapped until the process ends: a completion may come from gloo's thread while
      // the interpreter shuts down (the recorder never closes or resizes a segment).
      mapped->push_back(mm.release().ptr());
      segments[index].store(base, std::memory_order_release);
    } catch (py::error_already_set& e) {
      e.restore();
      PyErr_Clear();
      return nullptr;
    }
  }
  return base + (slot % PER_SEGMENT) * RECORD_SIZE;
}

void complete(int64_t token) {
  unsigned char* p = record_at(token - 1);
  if (p == nullptr) return;
  double t = monotonic();
  std::memcpy(p + T_DONE_OFFSET, &t, 8);
  __atomic_store_n(p + 1, STATE_COMPLETED, __ATOMIC_RELEASE);
}

void fail(int64_t token, const std::string& message) {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  try {
    (*fail_fn)(token, message);
  } catch (py::error_already_set& e) {
    e.restore();
    PyErr_Clear();
  }
}

OpInfo* info_of(const c10::OperatorHandle& op, int* index) {
  for (size_t i = 0; i < ops->size(); i++)
    if ((*ops)[i].op == op) {
      *index = (int)i;
      return &(*ops)[i];
    }
  return nullptr;
}

// The key of this call, if it is one the fast path can describe (one dense tensor).
bool key_of(const OpInfo& info, const torch::jit::Stack& stack, size_t base, Key* key) {
  if (info.t_arg < 0 || info.g_arg < 0) return false;
  const c10::IValue& t = stack[base + info.t_arg];
  at::Tensor tensor;
  if (t.isTensor()) {
    tensor = t.toTensor();
  } else if (t.isTensorList()) {
    auto list = t.toTensorList();
    if (list.size() != 1) return false;
    tensor = list.get(0);
  } else {
    return false;
  }
  if (!tensor.defined() || tensor.dim() > MAX_DIMS || tensor.is_sparse()) return false;
  key->ndim = (int)tensor.dim();
  for (int i = 0; i < key->ndim; i++) key->sizes[i] = tensor.sizes()[i];
  key->dtype = tensor.scalar_type();
  key->device = tensor.device().type();
  // A custom-class argument is boxed into a new Object per call: its one slot holds the group.
  const c10::IValue& pg = stack[base + info.g_arg];
  if (!pg.isObject() || pg.toObjectRef().slots().size() != 1 || !pg.toObjectRef().getSlot(0).isCapsule())
    return false;
  key->pg = pg.toObjectRef().getSlot(0).internalToPointer();
  if (info.ro_arg >= 0) {
    auto ro = stack[base + info.ro_arg].toCustomClass<c10d::ReduceOp>();
    if (ro->op_ == c10d::ReduceOp::PREMUL_SUM) return false;  // its factor is part of it
    key->ro = (int64_t)ro->op_;
  }
  if (info.root_arg >= 0) key->root = stack[base + info.root_arg].toInt();
  return true;
}

// Record from a cached entry; returns the token (0: not recorded).
int64_t record(Entry& e) {
  int64_t seq = e.seq->next.fetch_add(1), slot = e.slots->next.fetch_add(1);
  unsigned char* p = record_at(slot);
  if (p == nullptr) return 0;
  unsigned char rec[RECORD_SIZE] = {};
  uint16_t flags = 1;  // async: as the Python kernel records C++-issued calls
  double t = monotonic();
  rec[1] = STATE_ENTERED;
  std::memcpy(rec + 2, &flags, 2);
  std::memcpy(rec + 4, e.ids, sizeof e.ids);
  std::memcpy(rec + 28, &e.root, 4);
  std::memcpy(rec + 32, &seq, 8);
  std::memcpy(rec + 40, &t, 8);
  std::memcpy(p, rec, RECORD_SIZE);
  __atomic_store_n(p, KIND_CALL, __ATOMIC_RELEASE);  // last: the record is whole
  return slot + 1;
}

// After the Python kernel recorded this call: keep its ids for the next call like it.
void learn(Entry& e, const Key& key, uint64_t gen) {
  if (offered <= 0 || offered_seq == nullptr || offered_slots == nullptr) return;
  unsigned char* p = record_at(offered - 1);
  if (p == nullptr || __atomic_load_n(p, __ATOMIC_ACQUIRE) != KIND_CALL) return;
  uint32_t ids[6];
  std::memcpy(ids, p + 4, sizeof ids);
  if ((long)ids[2] != key.site) return;  // attributed elsewhere: not this rule's call
  for (PyObject* c : {(PyObject*)offered_seq, (PyObject*)offered_slots})
    if (kept->insert(c).second) Py_INCREF(c);
  e.gen = gen;
  e.key = key;
  std::memcpy(e.ids, ids, sizeof ids);
  std::memcpy(&e.root, p + 28, 4);
  e.seq = offered_seq;
  e.slots = offered_slots;
}

void redispatch_below(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

// The Python kernel's way: box the arguments, call it, unbox its result.
void through_python(OpInfo& info, c10::DispatchKeySet ks, torch::jit::Stack* stack, Entry* learn_into,
                    const Key& key, uint64_t gen) {
  n_python.fetch_add(1, std::memory_order_relaxed);
  py::gil_scoped_acquire gil;
  const auto& schema = info.op.schema();
  size_t n = schema.arguments().size();
  py::tuple args(n + 1);
  args[0] = py::cast(ks);
  for (size_t i = 0; i < n; i++) args[i + 1] = torch::jit::toPyObject((*stack)[stack->size() - n + i]);
  torch::jit::drop(*stack, n);
  offered = 0;
  py::object out = info.kernel(*args);
  const auto& rets = schema.returns();
  if (rets.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, rets[0].type()));
  } else {
    auto tuple = out.cast<py::tuple>();
    for (size_t i = 0; i < rets.size(); i++) stack->push_back(torch::jit::toIValue(tuple[i], rets[i].type()));
  }
  if (learn_into != nullptr) learn(*learn_into, key, gen);
  offered = 0;
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  int index = -1;
  OpInfo* info = info_of(op, &index);
  if (info == nullptr || inside) return redispatch_below(op, ks, stack);
  long site = backward_site.load(std::memory_order_acquire);
  if (site == 0 || runs_python()) return through_python(*info, ks, stack, nullptr, Key{}, 0);
  uint64_t gen = generation.load(std::memory_order_acquire);
  Key key;
  size_t base = stack->size() - info->op.schema().arguments().size();
  bool described = false;
  try {
    described = key_of(*info, *stack, base, &key);
  } catch (const std::exception&) {
  }
  if (!described) return through_python(*info, ks, stack, nullptr, key, gen);
  key.site = site;
  Entry& e = cache[index];
  if (e.gen != gen || !(e.key == key)) return through_python(*info, ks, stack, &e, key, gen);

  int64_t token = record(e);
  if (token == 0) return redispatch_below(op, ks, stack);
  n_fast.fetch_add(1, std::memory_order_relaxed);
  inside = true;
  try {
    redispatch_below(op, ks, stack);
  } catch (const std::exception& exc) {
    inside = false;
    fail(token, exc.what());
    throw;
  }
  inside = false;
  if (key.device == c10::DeviceType::CUDA) return complete(token);  // NCCL: at enqueue, as the Python kernel
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = stack->back().toCustomClass<c10d::Work>()->getFuture();
  } catch (const std::exception&) {
    return complete(token);  // no future: done when it returns
  }
  fut->addCallback([token](c10::ivalue::Future& f) {
    if (f.hasError()) fail(token, f.tryRetrieveErrorMessage());
    else complete(token);
  });
}

std::vector<std::unique_ptr<torch::Library>>* libraries = nullptr;

// The recorder renewed its tables (a forked child records into a ring of its own).
void forget_all() {
  for (auto& s : segments) s.store(nullptr);
  generation.fetch_add(1);
}

}  // namespace

PYBIND11_MODULE(_c10d_kernel, m) {
  m.doc() = "hctool's c10d capture kernel in C++ (see the source's head).";
  m.attr("torch_version") = HCTOOL_TORCH_VERSION;  // -D by kernel_build.py: the torch it was built against
  CounterType.tp_name = "hctool.agent.capture._c10d_kernel.Counter";
  CounterType.tp_basicsize = sizeof(CounterObject);
  CounterType.tp_flags = Py_TPFLAGS_DEFAULT;
  CounterType.tp_doc = "0, 1, 2, ... taken atomically (next() from Python, or from C++ without the GIL).";
  CounterType.tp_new = counter_new;
  CounterType.tp_iter = PyObject_SelfIter;
  CounterType.tp_iternext = counter_iternext;
  CounterType.tp_repr = counter_repr;
  if (PyType_Ready(&CounterType) < 0) throw py::error_already_set();
  m.attr("Counter") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&CounterType));
  ops = new std::vector<OpInfo>();
  ops->reserve(MAX_OPS);
  kept = new std::unordered_set<PyObject*>();
  mapped = new std::vector<PyObject*>();
  libraries = new std::vector<std::unique_ptr<torch::Library>>();
  pthread_atfork(nullptr, nullptr, forget_all);

  m.def("bind", [](py::object grow, py::object fail_) {
    grow_fn = new py::object(std::move(grow));
    fail_fn = new py::object(std::move(fail_));
  }, "bind(grow, fail): tracefile._grow(index) and fail(token, message).");
  m.def("register", [](const std::string& name, py::object kernel_, int t_arg, int g_arg, int ro_arg, int root_arg) {
    if (grow_fn == nullptr) throw std::runtime_error("bind() first");
    auto op = c10::Dispatcher::singleton().findSchema({"c10d::" + name, ""});
    if (!op.has_value() || ops->size() >= MAX_OPS) return false;
    ops->push_back(OpInfo{*op, std::move(kernel_), t_arg, g_arg, ro_arg, root_arg});
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::Autograd,
                                                __FILE__, __LINE__);
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
    libraries->push_back(std::move(lib));
    return true;
  }, "Put the kernel at the Autograd key of c10d::NAME; KERNEL is the Python kernel it calls.");
  m.def("offer", [](int64_t token, py::handle seq, py::handle slots) {
    bool ok = token > 0 && Py_TYPE(seq.ptr()) == &CounterType && Py_TYPE(slots.ptr()) == &CounterType;
    offered = ok ? token : 0;
    offered_seq = ok ? reinterpret_cast<CounterObject*>(seq.ptr()) : nullptr;
    offered_slots = ok ? reinterpret_cast<CounterObject*>(slots.ptr()) : nullptr;
  }, "offer(token, group seq, slots): the Python kernel's record of the call in progress.");
  m.def("set_backward_site", [](long site) { return backward_site.exchange(site); },
        "The main thread's backward call's site id (0: none); returns the previous one.");
  m.def("invalidate", []() { forget_all(); }, "Forget every cached call and segment (the recorder reset).");
  m.def("stats", []() {
    py::dict d;
    d["fast"] = n_fast.load();
    d["python"] = n_python.load();
    return d;
  }, "Calls recorded here / handed to the Python kernel.");
}
