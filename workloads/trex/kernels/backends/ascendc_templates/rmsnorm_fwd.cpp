/* RMSNorm forward on one AI core's rows: pass 1 accumulates x^2 tile by tile, pass 2 scales by rstd * w.
   Rendered constants: TILE_LEN, BUFFER_NUM (2 = double buffering of the in/out queues), RED_WORK_LEN (the
   ReduceSum work buffer for TILE_LEN fp32: ceil(TILE_LEN / 64) rounded up to 8 elements) and TREX_DCCI(g)
   (DataCacheCleanAndInvalid of one cache line, in the SoC's form).
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
    xGm_.SetGlobalBuffer((__gm__ float *)x + (uint64_t)row0 * t.cols, (uint64_t)rows_ * t.cols);
    yGm_.SetGlobalBuffer((__gm__ float *)y + (uint64_t)row0 * t.cols, (uint64_t)rows_ * t.cols);
    wGm_.SetGlobalBuffer((__gm__ float *)w, t.cols);
    rGm_.SetGlobalBuffer((__gm__ float *)rstd + row0, rows_);
    pipe_.InitBuffer(inQ_, BUFFER_NUM, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(wQ_, BUFFER_NUM, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(outQ_, BUFFER_NUM, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(sq_, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(work_, RED_WORK_LEN * sizeof(float));
    pipe_.InitBuffer(red_, 16 * sizeof(float));  /* [0, 8): the reduction / rstd, [8, 16): ones */
  }
  __aicore__ inline void Process() {
    for (uint32_t r = 0; r < rows_; ++r) {
      float ss = 0.0f;
      for (uint32_t i = 0; i < t_.tileNum; ++i) {
        const uint32_t n = Len(i);
        CopyIn(inQ_, xGm_, (uint64_t)r * t_.cols + i * TILE_LEN, n);
        LocalTensor<float> x = inQ_.DeQue<float>();
        LocalTensor<float> sq = sq_.Get<float>();
        LocalTensor<float> red = red_.Get<float>();
        Mul(sq, x, x, n);
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
        LocalTensor<float> x = inQ_.DeQue<float>();
        LocalTensor<float> w = wQ_.DeQue<float>();
        LocalTensor<float> y = outQ_.AllocTensor<float>();
        Muls(y, x, rs, n);
        Mul(y, y, w, n);
        outQ_.EnQue(y);
        inQ_.FreeTensor(x);
        wQ_.FreeTensor(w);
        LocalTensor<float> yo = outQ_.DeQue<float>();
        DataCopy(yGm_[(uint64_t)r * t_.cols + i * TILE_LEN], yo, Align(n));
        outQ_.FreeTensor(yo);
      }
    }
  }
private:
  __aicore__ inline uint32_t Len(uint32_t i) const { return i + 1 == t_.tileNum ? t_.lastTileLen : TILE_LEN; }
  __aicore__ inline uint32_t Align(uint32_t n) const { return (n + 7u) / 8u * 8u; }  /* 8 floats = 32 bytes */
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
  __aicore__ inline void CopyIn(Q &q, GlobalTensor<float> &g, uint64_t off, uint32_t n) {
    LocalTensor<float> l = q.template AllocTensor<float>();
    DataCopy(l, g[off], Align(n));
    q.EnQue(l);
  }
  TPipe pipe_;
  TQue<QuePosition::VECIN, BUFFER_NUM> inQ_, wQ_;
  TQue<QuePosition::VECOUT, BUFFER_NUM> outQ_;
  TBuf<QuePosition::VECCALC> sq_, work_, red_;
  GlobalTensor<float> xGm_, wGm_, yGm_, rGm_;
  TrexTiling t_;
  uint32_t rows_ = 0;
};

extern "C" __global__ __aicore__ void trex_rmsnorm_fwd(GM_ADDR x, GM_ADDR w, GM_ADDR y, GM_ADDR rstd, GM_ADDR tiling) {
  TrexTiling t = *reinterpret_cast<__gm__ TrexTiling *>(tiling);
  KernelRmsNorm op;
  op.Init(x, w, y, rstd, t);
  op.Process();
}
