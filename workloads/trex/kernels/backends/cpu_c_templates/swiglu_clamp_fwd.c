/* y = silu(min(g, L)) * clamp(u, -L, L). d = {rows, cols}, s = {limit}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *g = p[0], *u = p[1]; act_t *y = p[2];
  const int64_t R = d[0], C = d[1]; const float L = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const act_t *gr = g + r * C, *ur = u + r * C; act_t *yr = y + r * C;
    LOOP
    for (int64_t c = 0; c < C; ++c) {
      const float gc = MINF(LD(gr, c), L);
      const float uc = MINF(MAXF(LD(ur, c), -L), L);
      ST(yr, c, gc / (1.0f + EXPF(-gc)) * uc);
    }
  }
}
