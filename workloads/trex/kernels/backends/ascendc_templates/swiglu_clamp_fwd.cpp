/* SwiGLU with clamp, elementwise over one AI core's rows: y = silu(min(g, L)) * clamp(u, -L, L).
   Rendered constants: TILE_LEN, BUFFER_NUM, T_IN (element type of g, u and y in GM and in the queues: float or
   bfloat16_t) with TREX_BF16 (1 for bfloat16_t). In bf16 g and u are Cast to fp32 work tiles (CAST_NONE,
   exact), the arithmetic is fp32 and y is Cast back to bf16 with CAST_RINT (round to nearest even). */
#include "kernel_operator.h"
#include "tiling.h"
using namespace AscendC;

class KernelSwiGlu {
public:
  __aicore__ inline void Init(GM_ADDR g, GM_ADDR u, GM_ADDR y, const TrexTiling &t) {
    t_ = t;
    const uint32_t row0 = GetBlockIdx() * t.rowsPerCore;
    rows_ = row0 >= t.rows ? 0 : (t.rows - row0 < t.rowsPerCore ? t.rows - row0 : t.rowsPerCore);
    const uint64_t off = (uint64_t)row0 * t.cols, len = (uint64_t)rows_ * t.cols;
    gGm_.SetGlobalBuffer((__gm__ T_IN *)g + off, len);
    uGm_.SetGlobalBuffer((__gm__ T_IN *)u + off, len);
    yGm_.SetGlobalBuffer((__gm__ T_IN *)y + off, len);
    pipe_.InitBuffer(gQ_, BUFFER_NUM, TILE_LEN * sizeof(T_IN));
    pipe_.InitBuffer(uQ_, BUFFER_NUM, TILE_LEN * sizeof(T_IN));
    pipe_.InitBuffer(outQ_, BUFFER_NUM, TILE_LEN * sizeof(T_IN));
    pipe_.InitBuffer(tmp_, TILE_LEN * sizeof(float));
#if TREX_BF16
    pipe_.InitBuffer(gf_, TILE_LEN * sizeof(float));  /* g and u cast to fp32 */
    pipe_.InitBuffer(uf_, TILE_LEN * sizeof(float));
#endif
  }
  __aicore__ inline void Process() {
    for (uint32_t r = 0; r < rows_; ++r) {
      for (uint32_t i = 0; i < t_.tileNum; ++i) {
        const uint32_t n = i + 1 == t_.tileNum ? t_.lastTileLen : TILE_LEN;
        const uint32_t na = (n + BLK - 1u) / BLK * BLK;  /* whole 32-byte blocks of T_IN */
        const uint64_t off = (uint64_t)r * t_.cols + i * TILE_LEN;
        LocalTensor<T_IN> gl = gQ_.AllocTensor<T_IN>();
        LocalTensor<T_IN> ul = uQ_.AllocTensor<T_IN>();
        DataCopy(gl, gGm_[off], na);
        DataCopy(ul, uGm_[off], na);
        gQ_.EnQue(gl);
        uQ_.EnQue(ul);
        LocalTensor<T_IN> gq = gQ_.DeQue<T_IN>();
        LocalTensor<T_IN> uq = uQ_.DeQue<T_IN>();
        LocalTensor<float> e = tmp_.Get<float>();
        LocalTensor<T_IN> y = outQ_.AllocTensor<T_IN>();
#if TREX_BF16
        LocalTensor<float> gv = gf_.Get<float>();
        LocalTensor<float> uv = uf_.Get<float>();
        Cast(gv, gq, RoundMode::CAST_NONE, n);
        Cast(uv, uq, RoundMode::CAST_NONE, n);
#else
        LocalTensor<float> gv = gq, uv = uq;
#endif
        Mins(gv, gv, t_.scalar, n);            /* gate capped at L */
        Mins(uv, uv, t_.scalar, n);            /* linear part clamped to [-L, L] */
        Maxs(uv, uv, -t_.scalar, n);
        Muls(e, gv, -1.0f, n);
        Exp(e, e, n);
        Adds(e, e, 1.0f, n);
#if TREX_BF16
        Div(e, gv, e, n);                      /* silu(g) = g / (1 + exp(-g)) */
        Mul(e, e, uv, n);
        Cast(y, e, RoundMode::CAST_RINT, n);
#else
        Div(y, gv, e, n);                      /* silu(g) = g / (1 + exp(-g)) */
        Mul(y, y, uv, n);
#endif
        outQ_.EnQue(y);
        gQ_.FreeTensor(gq);
        uQ_.FreeTensor(uq);
        LocalTensor<T_IN> yo = outQ_.DeQue<T_IN>();
        DataCopy(yGm_[off], yo, na);
        outQ_.FreeTensor(yo);
      }
    }
  }
private:
  static constexpr uint32_t BLK = 32u / sizeof(T_IN);
  TPipe pipe_;
  TQue<QuePosition::VECIN, BUFFER_NUM> gQ_, uQ_;
  TQue<QuePosition::VECOUT, BUFFER_NUM> outQ_;
  TBuf<QuePosition::VECCALC> tmp_;
#if TREX_BF16
  TBuf<QuePosition::VECCALC> gf_, uf_;
#endif
  GlobalTensor<T_IN> gGm_, uGm_, yGm_;
  TrexTiling t_;
  uint32_t rows_ = 0;
};

extern "C" __global__ __aicore__ void trex_swiglu_clamp_fwd(GM_ADDR g, GM_ADDR u, GM_ADDR y, GM_ADDR tiling) {
  TrexTiling t = *reinterpret_cast<__gm__ TrexTiling *>(tiling);
  KernelSwiGlu op;
  op.Init(g, u, y, t);
  op.Process();
}
