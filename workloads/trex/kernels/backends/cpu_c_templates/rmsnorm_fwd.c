/* y = x * rsqrt(mean(x^2) + eps) * w, rstd saved for the backward. d = {rows, cols}, s = {eps}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *x = p[0], *w = p[1]; act_t *y = p[2]; float *rstd = p[3];
  const int64_t R = d[0], C = d[1]; const float eps = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const act_t *xr = x + r * C; act_t *yr = y + r * C;
    acc_t acc = 0;
    LOOP_SUM(acc)
    for (int64_t c = 0; c < C; ++c) { float v = LD(xr, c); acc += (acc_t)(v * v); }
    const float rs = 1.0f / sqrtf((float)(acc / (acc_t)C) + eps);
    rstd[r] = rs;
    LOOP
    for (int64_t c = 0; c < C; ++c) ST(yr, c, LD(xr, c) * rs * LD(w, c));
  }
}
