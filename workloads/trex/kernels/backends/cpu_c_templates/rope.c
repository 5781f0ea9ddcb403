/* Half-split rotary embedding; SIGN = +1 forward, -1 inverse. d = {tokens, heads, dim}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *x = p[0]; const float *cs = p[1], *sn = p[2]; act_t *y = p[3];
  const int64_t T = d[0], H = d[1], D = d[2], half = D / 2;
  (void)s;
  PARFOR
  for (int64_t t = 0; t < T; ++t) {
    const float *ct = cs + t * half, *st = sn + t * half;
    for (int64_t h = 0; h < H; ++h) {
      const act_t *xr = x + (t * H + h) * D; act_t *yr = y + (t * H + h) * D;
      LOOP
      for (int64_t i = 0; i < half; ++i) {
        const float a = LD(xr, i), b = LD(xr, i + half), c = ct[i], sv = SIGN * st[i];
        ST(yr, i, a * c - b * sv);
        ST(yr, i + half, b * c + a * sv);
      }
    }
  }
}
