/* SwiGLU with clamp, elementwise over one AI core's rows: y = silu(min(g, L)) * clamp(u, -L, L).
   Rendered constants: TILE_LEN, BUFFER_NUM. */
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
    gGm_.SetGlobalBuffer((__gm__ float *)g + off, len);
    uGm_.SetGlobalBuffer((__gm__ float *)u + off, len);
    yGm_.SetGlobalBuffer((__gm__ float *)y + off, len);
    pipe_.InitBuffer(gQ_, BUFFER_NUM, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(uQ_, BUFFER_NUM, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(outQ_, BUFFER_NUM, TILE_LEN * sizeof(float));
    pipe_.InitBuffer(tmp_, TILE_LEN * sizeof(float));
  }
  __aicore__ inline void Process() {
    for (uint32_t r = 0; r < rows_; ++r) {
      for (uint32_t i = 0; i < t_.tileNum; ++i) {
        const uint32_t n = i + 1 == t_.tileNum ? t_.lastTileLen : TILE_LEN;
        const uint32_t na = (n + 7u) / 8u * 8u;
        const uint64_t off = (uint64_t)r * t_.cols + i * TILE_LEN;
        LocalTensor<float> gl = gQ_.AllocTensor<float>();
        LocalTensor<float> ul = uQ_.AllocTensor<float>();
        DataCopy(gl, gGm_[off], na);
        DataCopy(ul, uGm_[off], na);
        gQ_.EnQue(gl);
        uQ_.EnQue(ul);
        LocalTensor<float> gv = gQ_.DeQue<float>();
        LocalTensor<float> uv = uQ_.DeQue<float>();
        LocalTensor<float> e = tmp_.Get<float>();
        LocalTensor<float> y = outQ_.AllocTensor<float>();
        Mins(gv, gv, t_.scalar, n);            /* gate capped at L */
        Mins(uv, uv, t_.scalar, n);            /* linear part clamped to [-L, L] */
        Maxs(uv, uv, -t_.scalar, n);
        Muls(e, gv, -1.0f, n);
        Exp(e, e, n);
        Adds(e, e, 1.0f, n);
        Div(y, gv, e, n);                      /* silu(g) = g / (1 + exp(-g)) */
        Mul(y, y, uv, n);
        outQ_.EnQue(y);
        gQ_.FreeTensor(gv);
        uQ_.FreeTensor(uv);
        LocalTensor<float> yo = outQ_.DeQue<float>();
        DataCopy(yGm_[off], yo, na);
        outQ_.FreeTensor(yo);
      }
    }
  }
private:
  TPipe pipe_;
  TQue<QuePosition::VECIN, BUFFER_NUM> gQ_, uQ_;
  TQue<QuePosition::VECOUT, BUFFER_NUM> outQ_;
  TBuf<QuePosition::VECCALC> tmp_;
  GlobalTensor<float> gGm_, uGm_, yGm_;
  TrexTiling t_;
  uint32_t rows_ = 0;
};

extern "C" __global__ __aicore__ void trex_swiglu_clamp_fwd(GM_ADDR g, GM_ADDR u, GM_ADDR y, GM_ADDR tiling) {
  TrexTiling t = *reinterpret_cast<__gm__ TrexTiling *>(tiling);
  KernelSwiGlu op;
  op.Init(g, u, y, t);
  op.Process();
}
