/* dg = dy * uc * silu'(gc) * [g <= L]; du = dy * silu(gc) * [-L <= u <= L]. d = {rows, cols}, s = {limit}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *dy = p[0], *g = p[1], *u = p[2]; act_t *dg = p[3], *du = p[4];
  const int64_t R = d[0], C = d[1]; const float L = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const int64_t o = r * C;
    LOOP
    for (int64_t c = 0; c < C; ++c) {
      const float gv = LD(g, o + c), uv = LD(u, o + c), dyv = LD(dy, o + c);
      const float gc = MINF(gv, L), uc = MINF(MAXF(uv, -L), L);
      const float sg = 1.0f / (1.0f + EXPF(-gc));
      const float dsilu = sg * (1.0f + gc * (1.0f - sg));
      ST(dg, o + c, gv <= L ? dyv * uc * dsilu : 0.0f);
      ST(du, o + c, (uv >= -L && uv <= L) ? dyv * gc * sg : 0.0f);
    }
  }
}
