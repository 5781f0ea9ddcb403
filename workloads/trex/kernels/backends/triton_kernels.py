# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels of the suite (imported only by the cuda-triton backend: this module imports triton).

Every kernel walks its reduction dimension in BLOCK-wide slices so any BLOCK is valid; loads are upcast
to fp32 and stores cast to the output's element type (fp32 or bf16).
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
