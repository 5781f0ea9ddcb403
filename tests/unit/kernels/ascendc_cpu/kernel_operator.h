/* A CPU stand-in for the subset of CANN's Ascend C API (kernel_operator.h) the trex templates use, written for
   contract tests: the kernels compile with g++ and run core by core on the host, and every rule the API
   reference states for these calls is checked and reported as an exception naming the rule:
   - UB allocations fit the SoC's Unified Buffer (the ub_bytes the driver runs with) and are 32-byte aligned;
   - DataCopy moves whole 32-byte blocks and stays inside the GlobalTensor it was given;
   - ReduceSum's work buffer is distinct from its source and at least the documented size;
   - a scalar GetValue of a vector result follows a V->S SetFlag/WaitFlag;
   - GlobalTensor::SetValue goes to the core's data cache: only DataCacheCleanAndInvalid writes the line to
     GM, an unflushed line at the end of a core is an error, and two cores flushing one line is an error;
   - bfloat16_t is a 16-bit storage type with no arithmetic (vector ops on it do not compile); Cast converts:
     bfloat16_t->float with CAST_NONE (exact), float->bfloat16_t with CAST_RINT (round to nearest, ties to
     even) or CAST_TRUNC; any other pairing or mode is reported.
   Not an emulator of timing or of the vector ISA beyond element-wise results. */
#ifndef TREX_ASCENDC_CPU_KERNEL_OPERATOR_H
#define TREX_ASCENDC_CPU_KERNEL_OPERATOR_H
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

/* bf16 storage: the top 16 bits of an IEEE float; only Cast converts it */
struct bfloat16_t {
  uint16_t bits;
};
static_assert(sizeof(bfloat16_t) == 2, "bfloat16_t is 16 bits");

#define __aicore__
#define __global__
#define __gm__
typedef uint8_t *GM_ADDR;

namespace AscendC {
enum class QuePosition { VECIN, VECOUT, VECCALC };
enum class HardEvent { V_S, S_V, MTE2_V, V_MTE3, MTE3_V, MTE2_S, S_MTE3 };
enum class CacheLine { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum class DcciDst { CACHELINE_ALL, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
typedef int event_t;
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };

inline void fail(const std::string &rule) { throw std::runtime_error(rule); }

/* one AI core's state, reset before each core runs */
struct CoreState {
  uint32_t block_idx = 0;
  std::vector<uint8_t> ub;
  size_t ub_used = 0;
  std::set<const void *> vector_pending;           /* UB tensors written by vector ops since the last V->S wait */
  std::map<uintptr_t, std::vector<uint8_t>> cache; /* dirty 64-byte GM lines of scalar writes */
};
inline CoreState &core() { static CoreState s; return s; }
inline std::map<uintptr_t, uint32_t> &flushed_by() { static std::map<uintptr_t, uint32_t> m; return m; }

inline uint32_t GetBlockIdx() { return core().block_idx; }

template <typename T> class LocalTensor {
public:
  T *ptr = nullptr;
  uint32_t len = 0;
  const void *base = nullptr; /* the buffer this view belongs to (for the V->S rule) */
  LocalTensor operator[](uint32_t off) const {
    if (off > len) fail("LocalTensor offset past its buffer");
    if ((off * sizeof(T)) % 32) fail("LocalTensor offset not 32-byte aligned");
    LocalTensor v = *this;
    v.ptr = ptr + off;
    v.len = len - off;
    return v;
  }
  T GetValue(uint32_t i) const {
    if (core().vector_pending.count(base)) fail("GetValue of a vector result without a V_S SetFlag/WaitFlag");
    if (i >= len) fail("GetValue past the buffer");
    return ptr[i];
  }
};

template <typename T> inline void written(const LocalTensor<T> &t) { core().vector_pending.insert(t.base); }
template <typename T> inline void check(const LocalTensor<T> &t, int32_t n) {
  if (n < 0 || (uint32_t)n > t.len) fail("vector op count exceeds the LocalTensor");
}

template <typename T> class GlobalTensor {
public:
  T *ptr = nullptr;
  uint64_t size = 0;
  void SetGlobalBuffer(T *p, uint64_t n) { ptr = p; size = n; }
  GlobalTensor operator[](uint64_t off) const {
    if (off > size) fail("GlobalTensor offset past its buffer");
    GlobalTensor g = *this;
    g.ptr = ptr + off;
    g.size = size - off;
    return g;
  }
  void SetValue(uint64_t i, T v) {
    if (i >= size) fail("GlobalTensor::SetValue past its buffer");
    uintptr_t addr = reinterpret_cast<uintptr_t>(ptr + i), line = addr & ~uintptr_t(63);
    auto &c = core().cache;
    if (!c.count(line)) {
      c[line].resize(64);
      std::memcpy(c[line].data(), reinterpret_cast<void *>(line), 64);
    }
    std::memcpy(c[line].data() + (addr - line), &v, sizeof(T));
  }
};

template <typename T, CacheLine mode, DcciDst dst> inline void DataCacheCleanAndInvalid(const GlobalTensor<T> &g) {
  static_assert(mode == CacheLine::SINGLE_CACHE_LINE, "only single-line cleaning is modelled");
  static_assert(dst == DcciDst::CACHELINE_OUT || dst == DcciDst::CACHELINE_ALL, "GM coherence needs CACHELINE_OUT");
  uintptr_t line = reinterpret_cast<uintptr_t>(g.ptr) & ~uintptr_t(63);
  auto &c = core().cache;
  auto it = c.find(line);
  if (it == c.end()) return;
  auto owner = flushed_by().find(line);
  if (owner != flushed_by().end() && owner->second != core().block_idx)
    fail("two cores write the same 64-byte GM line through the scalar unit");
  flushed_by()[line] = core().block_idx;
  std::memcpy(reinterpret_cast<void *>(line), it->second.data(), 64);
  c.erase(it);
}
template <typename T, CacheLine mode> inline void DataCacheCleanAndInvalid(const GlobalTensor<T> &g) {
  DataCacheCleanAndInvalid<T, mode, DcciDst::CACHELINE_OUT>(g);
}

class TPipe;
inline TPipe *&current_pipe() { static TPipe *p = nullptr; return p; }

class TPipe {
public:
  TPipe() { current_pipe() = this; }
  template <typename Q> void InitBuffer(Q &q, int num, uint32_t bytes) { q.init(alloc(bytes * num), num, bytes); }
  template <typename B> void InitBuffer(B &b, uint32_t bytes) { b.init(alloc(bytes), bytes); }
  int FetchEventID(HardEvent) { return next_event_++; }
private:
  uint8_t *alloc(uint32_t bytes) {
    if (bytes % 32) fail("UB buffer size not a multiple of 32 bytes");
    if (core().ub_used + bytes > core().ub.size()) fail("UB overflow: the buffers exceed the SoC's Unified Buffer");
    uint8_t *p = core().ub.data() + core().ub_used;
    core().ub_used += bytes;
    return p;
  }
  int next_event_ = 0;
};
inline TPipe *GetTPipePtr() { return current_pipe(); }

template <HardEvent E> inline void SetFlag(event_t) {}
template <HardEvent E> inline void WaitFlag(event_t) {
  if (E == HardEvent::V_S) core().vector_pending.clear();
}

template <QuePosition P, int DEPTH> class TQue {
public:
  void init(uint8_t *mem, int num, uint32_t bytes) { mem_ = mem; num_ = num; bytes_ = bytes; }
  template <typename T> LocalTensor<T> AllocTensor() {
    if (out_ >= num_) fail("TQue::AllocTensor with every buffer of the queue in use");
    LocalTensor<T> t;
    t.ptr = reinterpret_cast<T *>(mem_ + (next_++ % num_) * bytes_);
    t.len = bytes_ / sizeof(T);
    t.base = t.ptr;
    ++out_;
    return t;
  }
  template <typename T> void EnQue(const LocalTensor<T> &t) { fifo_.push_back(t.ptr); }
  template <typename T> LocalTensor<T> DeQue() {
    if (fifo_.empty()) fail("TQue::DeQue of an empty queue");
    LocalTensor<T> t;
    t.ptr = reinterpret_cast<T *>(fifo_.front());
    t.len = bytes_ / sizeof(T);
    t.base = t.ptr;
    fifo_.erase(fifo_.begin());
    return t;
  }
  template <typename T> void FreeTensor(const LocalTensor<T> &) { --out_; }
private:
  uint8_t *mem_ = nullptr;
  int num_ = 0, out_ = 0, next_ = 0;
  uint32_t bytes_ = 0;
  std::vector<void *> fifo_;
};

template <QuePosition P> class TBuf {
public:
  void init(uint8_t *mem, uint32_t bytes) { mem_ = mem; bytes_ = bytes; }
  template <typename T> LocalTensor<T> Get() const {
    LocalTensor<T> t;
    t.ptr = reinterpret_cast<T *>(mem_);
    t.len = bytes_ / sizeof(T);
    t.base = t.ptr;
    return t;
  }
private:
  uint8_t *mem_ = nullptr;
  uint32_t bytes_ = 0;
};

template <typename T> inline void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, uint32_t n) {
  if ((n * sizeof(T)) % 32) fail("DataCopy of a partial 32-byte block");
  if (n > dst.len || n > src.size) fail("DataCopy past the end of a tensor");
  std::memcpy(dst.ptr, src.ptr, n * sizeof(T));
}
template <typename T> inline void DataCopy(const GlobalTensor<T> &dst, const LocalTensor<T> &src, uint32_t n) {
  if ((n * sizeof(T)) % 32) fail("DataCopy of a partial 32-byte block");
  if (n > src.len || n > dst.size) fail("DataCopy past the end of a tensor");
  std::memcpy(dst.ptr, src.ptr, n * sizeof(T));
}

#define TREX_BINARY(NAME, EXPR)                                                                         \
  template <typename T> inline void NAME(const LocalTensor<T> &d, const LocalTensor<T> &a,              \
                                         const LocalTensor<T> &b, int32_t n) {                          \
    check(d, n); check(a, n); check(b, n);                                                              \
    for (int32_t i = 0; i < n; ++i) { T x = a.ptr[i], y = b.ptr[i]; d.ptr[i] = (EXPR); }                \
    written(d);                                                                                         \
  }
#define TREX_SCALAR(NAME, EXPR)                                                                         \
  template <typename T> inline void NAME(const LocalTensor<T> &d, const LocalTensor<T> &a, T s, int32_t n) { \
    check(d, n); check(a, n);                                                                           \
    for (int32_t i = 0; i < n; ++i) { T x = a.ptr[i]; d.ptr[i] = (EXPR); }                              \
    written(d);                                                                                         \
  }
#define TREX_UNARY(NAME, EXPR)                                                                          \
  template <typename T> inline void NAME(const LocalTensor<T> &d, const LocalTensor<T> &a, int32_t n) { \
    check(d, n); check(a, n);                                                                           \
    for (int32_t i = 0; i < n; ++i) { T x = a.ptr[i]; d.ptr[i] = (EXPR); }                              \
    written(d);                                                                                         \
  }
TREX_BINARY(Add, x + y)
TREX_BINARY(Sub, x - y)
TREX_BINARY(Mul, x * y)
TREX_BINARY(Div, x / y)
TREX_SCALAR(Adds, x + s)
TREX_SCALAR(Muls, x * s)
TREX_SCALAR(Mins, x < s ? x : s)
TREX_SCALAR(Maxs, x > s ? x : s)
TREX_UNARY(Exp, std::exp(x))
TREX_UNARY(Sqrt, std::sqrt(x))

template <typename T> inline void Duplicate(const LocalTensor<T> &d, T v, int32_t n) {
  check(d, n);
  for (int32_t i = 0; i < n; ++i) d.ptr[i] = v;
  written(d);
}

inline float bf16_to_float(bfloat16_t b) {
  uint32_t u = (uint32_t)b.bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bfloat16_t float_to_bf16(float f, RoundMode mode) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return bfloat16_t{(uint16_t)((u >> 16) | 0x40u)};  /* stays a quiet NaN */
  if (mode == RoundMode::CAST_RINT) u += 0x7fffu + ((u >> 16) & 1u);     /* ties to the even bf16 */
  else if (mode != RoundMode::CAST_TRUNC) fail("Cast float->bfloat16_t: only CAST_RINT and CAST_TRUNC are modelled "
                                              "(CAST_NONE is the exact widening mode, not a rounding)");
  return bfloat16_t{(uint16_t)(u >> 16)};
}

/* Cast(dst, src, roundMode, count): bfloat16_t->float (CAST_NONE) and float->bfloat16_t (CAST_RINT / CAST_TRUNC). */
inline void Cast(const LocalTensor<float> &d, const LocalTensor<bfloat16_t> &a, RoundMode mode, uint32_t n) {
  check(d, (int32_t)n); check(a, (int32_t)n);
  if (mode != RoundMode::CAST_NONE) fail("Cast bfloat16_t->float is exact: it takes CAST_NONE");
  for (uint32_t i = 0; i < n; ++i) d.ptr[i] = bf16_to_float(a.ptr[i]);
  written(d);
}
inline void Cast(const LocalTensor<bfloat16_t> &d, const LocalTensor<float> &a, RoundMode mode, uint32_t n) {
  check(d, (int32_t)n); check(a, (int32_t)n);
  for (uint32_t i = 0; i < n; ++i) d.ptr[i] = float_to_bf16(a.ptr[i], mode);
  written(d);
}

/* ReduceSum over the first n elements: work holds one partial per 64-element repeat, in whole 32-byte blocks. */
template <typename T> inline void ReduceSum(const LocalTensor<T> &d, const LocalTensor<T> &src,
                                            const LocalTensor<T> &work, int32_t n) {
  check(src, n);
  const T *w0 = work.ptr, *w1 = work.ptr + work.len, *s0 = src.ptr, *s1 = src.ptr + src.len;
  if (w0 < s1 && s0 < w1) fail("ReduceSum work buffer overlaps its source");
  const uint32_t per_repeat = 256 / sizeof(T), per_block = 32 / sizeof(T);
  const uint32_t repeats = n <= 0 ? 1 : (uint32_t)((n + per_repeat - 1) / per_repeat);
  if (work.len < (repeats + per_block - 1) / per_block * per_block) fail("ReduceSum work buffer below its minimum size");
  if (d.len < per_block) fail("ReduceSum destination smaller than one 32-byte block");
  double acc = 0.0;
  for (uint32_t r = 0; r < repeats; ++r) {
    double part = 0.0;
    for (uint32_t i = r * per_repeat; i < (r + 1) * per_repeat && i < (uint32_t)n; ++i) part += src.ptr[i];
    work.ptr[r] = (T)part;
    acc += part;
  }
  d.ptr[0] = (T)acc;
  written(d);
  written(work);
}
}  // namespace AscendC

/* Host driver: run a kernel on block_dim cores one after the other; a broken rule stops the run. */
inline std::string &trex_error() { static std::string e; return e; }
template <typename F> inline int trex_run_cores(uint32_t ub_bytes, uint32_t block_dim, F &&kernel) {
  AscendC::flushed_by().clear();
  try {
    for (uint32_t b = 0; b < block_dim; ++b) {
      AscendC::core() = AscendC::CoreState();
      AscendC::core().ub.resize(ub_bytes);
      AscendC::core().block_idx = b;
      kernel();
      if (!AscendC::core().cache.empty()) AscendC::fail("GlobalTensor::SetValue not cleaned out to GM "
                                                        "(DataCacheCleanAndInvalid) before the core ended");
    }
  } catch (const std::exception &e) {
    trex_error() = e.what();
    return 1;
  }
  return 0;
}
#endif
