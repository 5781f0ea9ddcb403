/* mHC pre-projection: RMSNorm over F = n*C features, projection to n*n logits, exp, Sinkhorn (rows then
   columns, `iters` times). Tokens go in blocks of four so each W row is loaded once per block; with
   n*n = 16 (four streams) the 4 x 16 accumulators stay in vector registers.
   FUSED 1: project x*gamma in the same pass and apply rstd afterwards; FUSED 0: normalise into a scratch
   block first, then project. d = {tokens, streams, hidden, iters}, s = {eps}. */
static void sinkhorn(acc_t *a, int64_t n, int64_t iters) {
  acc_t mx = a[0];
  for (int64_t m = 1; m < n * n; ++m) mx = a[m] > mx ? a[m] : mx;
  for (int64_t m = 0; m < n * n; ++m) a[m] = (acc_t)expf((float)(a[m] - mx));
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t i = 0; i < n; ++i) {
      acc_t rsum = 0;
      for (int64_t j = 0; j < n; ++j) rsum += a[i * n + j];
      const acc_t inv = (acc_t)1 / rsum;
      for (int64_t j = 0; j < n; ++j) a[i * n + j] *= inv;
    }
    for (int64_t j = 0; j < n; ++j) {
      acc_t csum = 0;
      for (int64_t i = 0; i < n; ++i) csum += a[i * n + j];
      const acc_t inv = (acc_t)1 / csum;
      for (int64_t i = 0; i < n; ++i) a[i * n + j] *= inv;
    }
  }
}

void trex_kernel(void **p, const int64_t *d, const double *s) {
  const float *x = p[0], *gamma = p[1], *w = p[2]; float *h = p[3];
  const int64_t T = d[0], n = d[1], F = d[1] * d[2], iters = d[3], nn = d[1] * d[1];
  const float eps = (float)s[0];
  const int64_t nblk = (T + 3) / 4;
  PARFOR
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t t0 = b * 4, tn = T - t0 < 4 ? T - t0 : 4;
    const float *xr[4];
    float rs[4];
    for (int64_t q = 0; q < 4; ++q) {
      xr[q] = x + (t0 + (q < tn ? q : 0)) * F;  /* missing tokens of a tail block repeat the first */
      acc_t ss = 0;
      const float *xt = xr[q];
      LOOP_SUM(ss)
      for (int64_t f = 0; f < F; ++f) ss += (acc_t)(xt[f] * xt[f]);
      rs[q] = 1.0f / sqrtf((float)(ss / (acc_t)F) + eps);
    }
    acc_t out[4][nn];
    if (nn == 16) {
      float c0[16] = {0}, c1[16] = {0}, c2[16] = {0}, c3[16] = {0};
      for (int64_t f = 0; f < F; ++f) {
        const float *wf = w + f * 16;
#if FUSED
        const float g = gamma[f];
        const float a0 = xr[0][f] * g, a1 = xr[1][f] * g, a2 = xr[2][f] * g, a3 = xr[3][f] * g;
#else
        const float g = gamma[f];
        const float a0 = xr[0][f] * rs[0] * g, a1 = xr[1][f] * rs[1] * g;
        const float a2 = xr[2][f] * rs[2] * g, a3 = xr[3][f] * rs[3] * g;
#endif
        LOOP
        for (int64_t m = 0; m < 16; ++m) {
          c0[m] += a0 * wf[m]; c1[m] += a1 * wf[m]; c2[m] += a2 * wf[m]; c3[m] += a3 * wf[m];
        }
      }
#if FUSED
      const float k0 = rs[0], k1 = rs[1], k2 = rs[2], k3 = rs[3];
#else
      const float k0 = 1.0f, k1 = 1.0f, k2 = 1.0f, k3 = 1.0f;
#endif
      for (int64_t m = 0; m < 16; ++m) {
        out[0][m] = (acc_t)(c0[m] * k0); out[1][m] = (acc_t)(c1[m] * k1);
        out[2][m] = (acc_t)(c2[m] * k2); out[3][m] = (acc_t)(c3[m] * k3);
      }
    } else {
      for (int64_t q = 0; q < 4; ++q) {
        for (int64_t m = 0; m < nn; ++m) out[q][m] = 0;
        for (int64_t f = 0; f < F; ++f) {
#if FUSED
          const float zf = xr[q][f] * gamma[f];
#else
          const float zf = xr[q][f] * rs[q] * gamma[f];
#endif
          const float *wf = w + f * nn;
          LOOP
          for (int64_t m = 0; m < nn; ++m) out[q][m] += (acc_t)(zf * wf[m]);
        }
#if FUSED
        for (int64_t m = 0; m < nn; ++m) out[q][m] *= (acc_t)rs[q];
#endif
      }
    }
    for (int64_t q = 0; q < tn; ++q) {
      sinkhorn(out[q], n, iters);
      for (int64_t m = 0; m < nn; ++m) h[(t0 + q) * nn + m] = (float)out[q][m];
    }
  }
}
