/* RMSNorm forward on one AI core's rows: pass 1 accumulates x^2 tile by tile, pass 2 scales by rstd * w.
   Rendered constants: TILE_LEN, BUFFER_NUM (2 = double buffering of the in/out queues), RED_WORK_LEN (the
   ReduceSum work buffer for TILE_LEN fp32: ceil(TILE_LEN / 64) rounded up to 8 elements) and TREX_DCCI(g)
   (DataCacheCleanAndInvalid of one cache line, in the SoC's form), T_IN (the element type of x, w and y in
   GM and in the in/out queues: float or bfloat16_t) with TREX_BF16 (1 for bfloat16_t). In bf16 each tile is
   Cast to fp32 (CAST_NONE, exact) into fp32 work tiles, the arithmetic and rstd are fp32, and y is Cast back
   to bf16 with CAST_RINT (round to nearest even) before the copy out; rstd stays fp32 in GM.
   Scalar reads of vector results wait on a V->S flag; rstd is written by the scalar unit, so each line is
   cleaned out to GM (the host tiling gives every core whole 64-byte lines of rstd). */
#include "kernel_operator.h"
#include "tiling.h"
using namespace AscendC;

class KernelRmsNorm {
public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR w, GM_ADDR y, GM_ADDR rstd, const TrexTiling &t) {
    t_ = t;
    const uint32_t row0 = GetBlockIdx() * t.rowsPerCore;
    rows_ = row0 >= t.rows ? 0 : (t.rows - row0 < t.rowsPerCore ? t.rows - row0 : t.rowsPerCore);
    xGm_.SetGlobalBuffer((__gm__ T_IN *)x + (uint64_t)row0 * t.cols, (uint64_t)rows_ * t.cols);
    yGm_.SetGlobalBuffer((__gm__ T_IN *)y + (uint64_t)row0 * t.cols, (uint64_t)rows_ * t.cols);
    wGm_.SetGlobalBuffer((__gm__ T_IN *)w, t.cols);
    rGm_.SetGlobalBuffer((__gm__ float *)rstd + row0, rows_);
    pipe_.InitBuffer(inQ_, BUFFER_NUM, TILE_LEN * sizeof(T_IN));
    pipe_.InitBuffer(wQ_, BUFFER_NUM, TILE_LEN * sizeof(T_IN));
    pipe_.InitBuffer(outQ_, BUFFER_NUM, TILE_LEN * sizeof(T_IN));
    pipe_.InitBuffer(sq_, TILE_LEN * sizeof(float));  /* x^2 (fp32); in bf16 also x cast to fp32 */
#if TREX_BF16
    pipe_.InitBuffer(wf_, TILE_LEN * sizeof(float));  /* w cast to fp32 */
#endif
    pipe_.InitBuffer(work_, RED_WORK_LEN * sizeof(float));
    pipe_.InitBuffer(red_, 16 * sizeof(float));  /* [0, 8): the reduction / rstd, [8, 16): ones */
  }
  __aicore__ inline void Process() {
    for (uint32_t r = 0; r < rows_; ++r) {
      float ss = 0.0f;
      for (uint32_t i = 0; i < t_.tileNum; ++i) {
        const uint32_t n = Len(i);
        CopyIn(inQ_, xGm_, (uint64_t)r * t_.cols + i * TILE_LEN, n);
        LocalTensor<T_IN> x = inQ_.DeQue<T_IN>();
        LocalTensor<float> sq = sq_.Get<float>();
        LocalTensor<float> red = red_.Get<float>();
#if TREX_BF16
        Cast(sq, x, RoundMode::CAST_NONE, n);
        Mul(sq, sq, sq, n);
#else
        Mul(sq, x, x, n);
#endif
        ReduceSum(red, sq, work_.Get<float>(), n);
        inQ_.FreeTensor(x);
        ss += ScalarRead(red);
      }
      const float rs = Rstd(ss / (float)t_.cols + t_.scalar);
      rGm_.SetValue(r, rs);
      TREX_DCCI(rGm_[r]);
      for (uint32_t i = 0; i < t_.tileNum; ++i) {
        const uint32_t n = Len(i);
        CopyIn(inQ_, xGm_, (uint64_t)r * t_.cols + i * TILE_LEN, n);
        CopyIn(wQ_, wGm_, i * TILE_LEN, n);
        LocalTensor<T_IN> x = inQ_.DeQue<T_IN>();
        LocalTensor<T_IN> w = wQ_.DeQue<T_IN>();
        LocalTensor<T_IN> y = outQ_.AllocTensor<T_IN>();
#if TREX_BF16
        LocalTensor<float> xf = sq_.Get<float>();
        LocalTensor<float> wf = wf_.Get<float>();
        Cast(xf, x, RoundMode::CAST_NONE, n);
        Cast(wf, w, RoundMode::CAST_NONE, n);
        Muls(xf, xf, rs, n);
        Mul(xf, xf, wf, n);
        Cast(y, xf, RoundMode::CAST_RINT, n);
#else
        Muls(y, x, rs, n);
        Mul(y, y, w, n);
#endif
        outQ_.EnQue(y);
        inQ_.FreeTensor(x);
        wQ_.FreeTensor(w);
        LocalTensor<T_IN> yo = outQ_.DeQue<T_IN>();
        DataCopy(yGm_[(uint64_t)r * t_.cols + i * TILE_LEN], yo, Align(n));
        outQ_.FreeTensor(yo);
      }
    }
  }
private:
  __aicore__ inline uint32_t Len(uint32_t i) const { return i + 1 == t_.tileNum ? t_.lastTileLen : TILE_LEN; }
  /* whole 32-byte blocks of T_IN: 8 fp32 or 16 bf16 elements */
  __aicore__ inline uint32_t Align(uint32_t n) const { return (n + BLK - 1u) / BLK * BLK; }
  static constexpr uint32_t BLK = 32u / sizeof(T_IN);
  /* element 0 of a vector result, read by the scalar unit once the vector pipe has written it */
  __aicore__ inline float ScalarRead(const LocalTensor<float> &v) {
    event_t ev = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
    SetFlag<HardEvent::V_S>(ev);
    WaitFlag<HardEvent::V_S>(ev);
    return v.GetValue(0);
  }
  /* 1 / sqrt(v) on the vector unit (exact Div, not an approximate reciprocal) */
  __aicore__ inline float Rstd(float v) {
    LocalTensor<float> red = red_.Get<float>();
    Duplicate(red, v, 8);
    Duplicate(red[8], 1.0f, 8);
    Sqrt(red, red, 8);
    Div(red, red[8], red, 8);
    return ScalarRead(red);
  }
  template <typename Q>
  __aicore__ inline void CopyIn(Q &q, GlobalTensor<T_IN> &g, uint64_t off, uint32_t n) {
    LocalTensor<T_IN> l = q.template AllocTensor<T_IN>();
    DataCopy(l, g[off], Align(n));
    q.EnQue(l);
  }
  TPipe pipe_;
  TQue<QuePosition::VECIN, BUFFER_NUM> inQ_, wQ_;
  TQue<QuePosition::VECOUT, BUFFER_NUM> outQ_;
  TBuf<QuePosition::VECCALC> sq_, work_, red_;
#if TREX_BF16
  TBuf<QuePosition::VECCALC> wf_;
#endif
  GlobalTensor<T_IN> xGm_, wGm_, yGm_;
  GlobalTensor<float> rGm_;
  TrexTiling t_;
  uint32_t rows_ = 0;
};

extern "C" __global__ __aicore__ void trex_rmsnorm_fwd(GM_ADDR x, GM_ADDR w, GM_ADDR y, GM_ADDR rstd, GM_ADDR tiling) {
  TrexTiling t = *reinterpret_cast<__gm__ TrexTiling *>(tiling);
  KernelRmsNorm op;
  op.Init(x, w, y, rstd, t);
  op.Process();
}
