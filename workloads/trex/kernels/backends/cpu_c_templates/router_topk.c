/* Router: s = sigmoid(z) (score 1) or sqrt(softplus(z)) (score 2); top-k of s + bias by insertion into a
   sorted k-list (ties keep the lower index); weights = s[idx] / sum. d = {tokens, experts, k, score}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const float *z = p[0], *bias = p[1]; int64_t *idx = p[2]; float *wt = p[3];
  const int64_t T = d[0], E = d[1], K = d[2], score = d[3];
  (void)s;
  PARFOR
  for (int64_t t = 0; t < T; ++t) {
    float sc[E];
    const float *zt = z + t * E;
    if (score == 1) {
      LOOP
      for (int64_t e = 0; e < E; ++e) sc[e] = 1.0f / (1.0f + EXPF(-zt[e]));
    } else {
      LOOP
      for (int64_t e = 0; e < E; ++e) {
        const float v = zt[e];
#if EXP_POLY
        /* softplus(v) = max(v, 0) + log1p(exp(-|v|)): vectorisable and overflow-free */
        sc[e] = sqrtf(MAXF(v, 0.0f) + log1p_poly(exp_poly(-fabsf(v))));
#else
        sc[e] = sqrtf(v > 20.0f ? v : log1pf(expf(v)));
#endif
      }
    }
    float best[K]; int64_t bi[K]; int64_t n = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float v = sc[e] + bias[e];
      if (n == K && !(v > best[K - 1])) continue;
      int64_t j = n < K ? n++ : K - 1;
      while (j > 0 && v > best[j - 1]) { best[j] = best[j - 1]; bi[j] = bi[j - 1]; --j; }
      best[j] = v; bi[j] = e;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += sc[bi[j]];
    for (int64_t j = 0; j < K; ++j) { idx[t * K + j] = bi[j]; wt[t * K + j] = sc[bi[j]] / sum; }
  }
}
