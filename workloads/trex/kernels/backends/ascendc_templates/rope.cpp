/* Half-split rotary embedding on one AI core's (token, head) rows; scalar = +1 forward, -1 inverse.
   Rendered constants: TILE_LEN (elements of one half), BUFFER_NUM, KERNEL_NAME. */
#include "kernel_operator.h"
#include "tiling.h"
using namespace AscendC;

class KernelRope {
public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR cs, GM_ADDR sn, GM_ADDR y, const TrexTiling &t, uint32_t heads) {
    t_ = t;
    heads_ = heads;
    row0_ = GetBlockIdx() * t.rowsPerCore;
    rows_ = row0_ >= t.rows ? 0 : (t.rows - row0_ < t.rowsPerCore ? t.rows - row0_ : t.rowsPerCore);
    xGm_.SetGlobalBuffer((__gm__ float *)x, (uint64_t)t.rows * 2 * t.cols);
    yGm_.SetGlobalBuffer((__gm__ float *)y, (uint64_t)t.rows * 2 * t.cols);
    cGm_.SetGlobalBuffer((__gm__ float *)cs, (uint64_t)(t.rows / heads) * t.cols);
    sGm_.SetGlobalBuffer((__gm__ float *)sn, (uint64_t)(t.rows / heads) * t.cols);
    pipe_.InitBuffer(inQ_, BUFFER_NUM, 4 * TILE_LEN * sizeof(float));
    pipe_.InitBuffer(outQ_, BUFFER_NUM, 2 * TILE_LEN * sizeof(float));
    pipe_.InitBuffer(tmp_, TILE_LEN * sizeof(float));
  }
  __aicore__ inline void Process() {
    for (uint32_t r = row0_; r < row0_ + rows_; ++r) {
      const uint64_t tok = r / heads_;
      for (uint32_t i = 0; i < t_.tileNum; ++i) {
        const uint32_t n = i + 1 == t_.tileNum ? t_.lastTileLen : TILE_LEN;
        const uint32_t na = (n + 7u) / 8u * 8u;
        const uint64_t xo = (uint64_t)r * 2 * t_.cols + i * TILE_LEN, co = tok * t_.cols + i * TILE_LEN;
        LocalTensor<float> in = inQ_.AllocTensor<float>();
        DataCopy(in, xGm_[xo], na);
        DataCopy(in[TILE_LEN], xGm_[xo + t_.cols], na);
        DataCopy(in[2 * TILE_LEN], cGm_[co], na);
        DataCopy(in[3 * TILE_LEN], sGm_[co], na);
        inQ_.EnQue(in);
        LocalTensor<float> v = inQ_.DeQue<float>();
        LocalTensor<float> a = v, b = v[TILE_LEN], c = v[2 * TILE_LEN], s = v[3 * TILE_LEN];
        LocalTensor<float> tmp = tmp_.Get<float>();
        LocalTensor<float> y = outQ_.AllocTensor<float>();
        Muls(s, s, t_.scalar, n);
        Mul(y, a, c, n);
        Mul(tmp, b, s, n);
        Sub(y, y, tmp, n);                     /* a c - b s */
        Mul(y[TILE_LEN], b, c, n);
        Mul(tmp, a, s, n);
        Add(y[TILE_LEN], y[TILE_LEN], tmp, n); /* b c + a s */
        outQ_.EnQue(y);
        inQ_.FreeTensor(v);
        LocalTensor<float> yo = outQ_.DeQue<float>();
        DataCopy(yGm_[xo], yo, na);
        DataCopy(yGm_[xo + t_.cols], yo[TILE_LEN], na);
        outQ_.FreeTensor(yo);
      }
    }
  }
private:
  TPipe pipe_;
  TQue<QuePosition::VECIN, BUFFER_NUM> inQ_;
  TQue<QuePosition::VECOUT, BUFFER_NUM> outQ_;
  TBuf<QuePosition::VECCALC> tmp_;
  GlobalTensor<float> xGm_, yGm_, cGm_, sGm_;
  TrexTiling t_;
  uint32_t heads_ = 1, row0_ = 0, rows_ = 0;
};

extern "C" __global__ __aicore__ void KERNEL_NAME(GM_ADDR x, GM_ADDR cs, GM_ADDR sn, GM_ADDR y, GM_ADDR tiling,
                                                  uint32_t heads) {
  TrexTiling t = *reinterpret_cast<__gm__ TrexTiling *>(tiling);
  KernelRope op;
  op.Init(x, cs, sn, y, t, heads);
  op.Process();
}
