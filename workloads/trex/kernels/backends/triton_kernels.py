# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels of the suite (imported only by the cuda-triton backend: this module imports triton).

Every kernel walks its reduction dimension in BLOCK-wide slices so any BLOCK is valid (the router holds
BLOCK tokens by all experts instead; the grouped GEMM tiles rows, columns and depth by MB, NB, KB); loads
are upcast to fp32 and stores cast to the output's element type (fp32 or bf16).
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG = -1.0e30  # finite "minus infinity" for running maxima (keeps exp(m_old - m_new) finite)


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, C, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * C
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, C, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < C, other=0.0).to(tl.float32)
        acc += x * x
    rs = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / C + eps)
    tl.store(rstd_ptr + row, rs)
    for c0 in range(0, C, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        m = offs < C
        x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + offs, (x * rs * w).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def swiglu_fwd_kernel(g_ptr, u_ptr, y_ptr, N, limit, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.minimum(tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32), limit)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def swiglu_bwd_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, N, limit, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=m, other=0.0).to(tl.float32)
    gc = tl.minimum(g, limit)
    uc = tl.minimum(tl.maximum(u, -limit), limit)
    sg = 1.0 / (1.0 + tl.exp(-gc))
    dg = tl.where(g <= limit, dy * uc * sg * (1.0 + gc * (1.0 - sg)), 0.0)
    du = tl.where((u >= -limit) & (u <= limit), dy * gc * sg, 0.0)
    tl.store(dg_ptr + offs, dg.to(dg_ptr.dtype.element_ty), mask=m)
    tl.store(du_ptr + offs, du.to(du_ptr.dtype.element_ty), mask=m)


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, D, sign, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = pid // H
    half = D // 2
    base = pid.to(tl.int64) * D
    for i0 in range(0, half, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        m = offs < half
        a = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32)
        b = tl.load(x_ptr + base + half + offs, mask=m, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + t * half + offs, mask=m, other=0.0)
        s = tl.load(sin_ptr + t * half + offs, mask=m, other=0.0) * sign
        tl.store(y_ptr + base + offs, (a * c - b * s).to(y_ptr.dtype.element_ty), mask=m)
        tl.store(y_ptr + base + half + offs, (b * c + a * s).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def cross_entropy_kernel(z_ptr, tgt_ptr, loss_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * V
    m = tl.full([BLOCK], NEG, dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        mn = tl.maximum(m, z)
        s = s * tl.exp(m - mn) + tl.exp(z - mn)
        m = mn
    mx = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - mx), axis=0)
    t = tl.load(tgt_ptr + row)
    zt = tl.load(z_ptr + base + t).to(tl.float32)
    tl.store(loss_ptr + row, mx + tl.log(total) - zt)


@triton.jit
def kl_div_kernel(p_ptr, q_ptr, kl_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * V
    mp = tl.full([BLOCK], NEG, dtype=tl.float32)
    mq = tl.full([BLOCK], NEG, dtype=tl.float32)
    sp = tl.zeros([BLOCK], dtype=tl.float32)
    sq = tl.zeros([BLOCK], dtype=tl.float32)
    a = tl.zeros([BLOCK], dtype=tl.float32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        msk = offs < V
        p = tl.load(p_ptr + base + offs, mask=msk, other=float("-inf")).to(tl.float32)
        q = tl.load(q_ptr + base + offs, mask=msk, other=float("-inf")).to(tl.float32)
        mpn = tl.maximum(mp, p)
        f = tl.exp(mp - mpn)
        e = tl.exp(p - mpn)
        sp = sp * f + e
        a = a * f + e * tl.where(msk, p - q, 0.0)
        mp = mpn
        mqn = tl.maximum(mq, q)
        sq = sq * tl.exp(mq - mqn) + tl.exp(q - mqn)
        mq = mqn
    Mp = tl.max(mp, axis=0)
    Mq = tl.max(mq, axis=0)
    wp = tl.exp(mp - Mp)
    Sp = tl.sum(sp * wp, axis=0)
    A = tl.sum(a * wp, axis=0)
    Sq = tl.sum(sq * tl.exp(mq - Mq), axis=0)
    tl.store(kl_ptr + row, A / Sp - (Mp + tl.log(Sp)) + (Mq + tl.log(Sq)))


@triton.jit
def router_topk_kernel(z_ptr, bias_ptr, idx_ptr, w_ptr, T, E, K: tl.constexpr, SCORE: tl.constexpr,
                       EP: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
    # BLOCK tokens per program, all E experts (padded to EP) in registers; top-k by K rounds of
    # argmax-and-exclude (ties go to the lower expert index, as a stable descending sort orders them)
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, EP)
    rm = rows < T
    cm = cols < E
    m2 = rm[:, None] & cm[None, :]
    z = tl.load(z_ptr + rows[:, None] * E + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    if SCORE == 1:
        sc = 1.0 / (1.0 + tl.exp(-z))
    else:
        # softplus(z) = max(z, 0) + log(1 + exp(-|z|)): no overflow for large z
        sc = tl.sqrt(tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z))))
    b = tl.load(bias_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    sel = tl.where(m2, sc + b[None, :], float("-inf"))
    kcol = tl.arange(0, KP)
    wt = tl.zeros([BLOCK, KP], dtype=tl.float32)
    it = tl.zeros([BLOCK, KP], dtype=tl.int64)
    for j in tl.static_range(K):
        mx = tl.max(sel, axis=1)
        pick = tl.min(tl.where(sel == mx[:, None], cols[None, :], EP), axis=1)
        hit = cols[None, :] == pick[:, None]
        wj = tl.sum(tl.where(hit, sc, 0.0), axis=1)
        wt = tl.where(kcol[None, :] == j, wj[:, None], wt)
        it = tl.where(kcol[None, :] == j, pick.to(tl.int64)[:, None], it)
        sel = tl.where(hit, float("-inf"), sel)
    wt = wt / tl.sum(wt, axis=1)[:, None]
    om = rm[:, None] & (kcol[None, :] < K)
    tl.store(idx_ptr + rows[:, None] * K + kcol[None, :], it, mask=om)
    tl.store(w_ptr + rows[:, None] * K + kcol[None, :], wt, mask=om)


@triton.jit
def grouped_gemm_kernel(x_ptr, w_ptr, off_ptr, y_ptr, H, OUT, MB: tl.constexpr, NB: tl.constexpr,
                        KB: tl.constexpr):
    # one program per (NB-wide column tile, expert); it walks its expert's rows in MB-row tiles and the
    # hidden dimension in KB-deep slices (fp32 products, IEEE: no TF32 rounding)
    n0 = tl.program_id(0) * NB
    e = tl.program_id(1)
    start = tl.load(off_ptr + e)
    end = tl.load(off_ptr + e + 1)
    cols = n0 + tl.arange(0, NB)
    cm = cols < OUT
    wbase = w_ptr + e.to(tl.int64) * H * OUT
    for m0 in range(start, end, MB):
        rows = m0 + tl.arange(0, MB)
        rm = rows < end
        acc = tl.zeros([MB, NB], dtype=tl.float32)
        for k0 in range(0, H, KB):
            ks = k0 + tl.arange(0, KB)
            km = ks < H
            a = tl.load(x_ptr + rows[:, None] * H + ks[None, :], mask=rm[:, None] & km[None, :], other=0.0)
            b = tl.load(wbase + ks[:, None] * OUT + cols[None, :], mask=km[:, None] & cm[None, :], other=0.0)
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        tl.store(y_ptr + rows[:, None] * OUT + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=rm[:, None] & cm[None, :])


@triton.jit
def mhc_pre_kernel(x_ptr, g_ptr, w_ptr, h_ptr, F, iters, eps, N: tl.constexpr, NNP: tl.constexpr,
                   BLOCK: tl.constexpr):
    # one program per token: mean square over the F = N*C features, then the N*N mixing logits
    # z @ w in BLOCK-wide feature slices, then Sinkhorn on the N x N matrix held as a flat NNP vector
    tok = tl.program_id(0)
    base = tok.to(tl.int64) * F
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for f0 in range(0, F, BLOCK):
        offs = f0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < F, other=0.0).to(tl.float32)
        acc += x * x
    rs = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / F + eps)
    m = tl.arange(0, NNP)
    mv = m < N * N
    logit = tl.zeros([NNP], dtype=tl.float32)
    for f0 in range(0, F, BLOCK):
        offs = f0 + tl.arange(0, BLOCK)
        fm = offs < F
        x = tl.load(x_ptr + base + offs, mask=fm, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=fm, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs[:, None] * (N * N) + m[None, :], mask=fm[:, None] & mv[None, :], other=0.0)
        logit += tl.sum((x * rs * g)[:, None] * w.to(tl.float32), axis=0)
    a = tl.where(mv, logit, float("-inf"))
    k = tl.where(mv, tl.exp(a - tl.max(a, axis=0)), 0.0)
    r = m // N
    c = m % N
    same_r = (r[:, None] == r[None, :]) & mv[None, :]
    same_c = (c[:, None] == c[None, :]) & mv[None, :]
    for _ in range(iters):
        rsum = tl.sum(tl.where(same_r, k[None, :], 0.0), axis=1)
        k = tl.where(mv, k / tl.where(mv, rsum, 1.0), 0.0)
        csum = tl.sum(tl.where(same_c, k[None, :], 0.0), axis=1)
        k = tl.where(mv, k / tl.where(mv, csum, 1.0), 0.0)
    tl.store(h_ptr + tok.to(tl.int64) * (N * N) + m, k, mask=mv)
