// attention.cl's kernels with local-memory tiles (GPUs), pasted at its end by core.device.kernel_source: they
// use its macros (HD, VW, ...) and helpers. Layouts, formulas and sources: attention.cl's header.
//
// ------------------------------------------------------------- staged tiles (GPUs)
// A work-group of BWG work-items (FWG in the forward; any >= 1) stages blocks of rows of Q, K, V (and dO) in
// local memory and computes a tile of scores once from register micro-tiles: each work-item computes a few rows
// x keys of it
// (rows and keys strided, so the 8 work-items of a quarter warp read 8 different local rows, 4 banks apart)
// from float4 reads of local rows, then a few rows x 4 or 8 columns of the output block, each local float4
// and scalar read feeding several FMAs (staged kernels with one local read per FMA were 2.3-2.4x slower on
// an H200). Local rows are LDR floats (head_dim padded to 4, plus 4: float4-aligned, consecutive rows
// 4 banks apart).
//
// Forward (built with -DFQ=... -DFK=..., powers of two >= 4, -DFWG=... work-items per group, and -DBT):
// FlashAttention-2's forward (Dao 2023, Algorithm 1): a work-group owns FQ query rows, walks their visible keys in
// blocks of FK, computes the FQ x FK tile of scores into local memory, updates each row's running max and sum there
// (one work-item per row), and adds P V into register accumulators of 4 rows x 8 columns.
// Backward (built with -DBT=..., a power of two): FlashAttention-2's blocked loop (Dao 2023, Algorithm 2):
// a work-group stages a block of BT keys and values and a block of BT query rows (with their lse and D),
// computes the BT x BT tile of P = exp(S - lse) and dS = P (dP - D) once into local memory (micro-tiles of
// TI x TJ), then adds TJ rows x 4 columns of dK and dV (or dQ) into registers. The dK/dV pass's tiles are
// key-major, so it reads 4 query rows of a key's P and dS as one float4 (on an H100 at d1024's shape 13.1 -> 12.5 ms
// of a training step), rows of LDP = BT + 4 floats (float4-aligned; the 8 rows a quarter warp reads at once lie 4
// banks apart); the dQ pass's are query-major, rows of LDQ = BT + 1 floats. The dK/dV kernel fetches the next query block into
// registers while it uses this one (Q_PREFETCH: where that is at most 16 floats each of Q and dO per work-item;
// on an H100 at d1024's shape 13.6 -> 13.1 ms of a training step; the same for the staged forward's key blocks
// measured 5 % slower, so it stages them as before). The blocked backward (-DBR, -DBC) is further below.
#ifdef BT
#define TI (BT < 2 ? BT : 2)
#define TJ (BT < 4 ? BT : 4)
#define HD4 ((HD + 3) / 4)                 // float4 vectors of a row
#define LDR (HD4 * 4 + 4)                  // local row stride
#if BT >= 4
#define LDP (BT + 4)                       // key-major P / dS tile row stride: float4-aligned rows, 4 banks apart
#else
#define LDP (BT + 1)
#endif
#define LDQ (BT + 1)                       // query-major P / dS tile row stride (odd: dQ reads 8 rows of a column)
#define NMT ((BT / TI) * (BT / TJ))        // micro-tiles of the P / dS tile
#define NMA ((BT / TJ) * HD4)              // micro-tiles of dK / dV / dQ (TJ rows x 4 columns)
#define MA ((NMA + BWG - 1) / BWG)         // accumulator micro-tiles per work-item
#define HD8 ((HD4 + 1) / 2)                // 8-column blocks of a row (the staged forward's and blocked backward's)
union lanes4 { float4 v; float a[4]; };

// rows r0 .. r0 + n - 1 (0.0f past seq, and in columns HD .. HD4 * 4 - 1) of one head of x -> dst, by the
// work-group's work-items (lid of items)
inline void stage_rows(__local float* dst, const __global float* x, const int r0, const int n, const int seq,
                       const size_t stride, const int lid, const int items) {
#if HD % 4 == 0  // whole float4s: a quarter of the loads and stores
    for (int e = lid; e < n * HD4; e += items) {
        const int r = e / HD4, d4 = e % HD4;
        const float4 v = r0 + r < seq ? vload4(0, x + (size_t)(r0 + r) * stride + 4 * d4) : (float4)(0.0f);
        vstore4(v, 0, dst + r * LDR + 4 * d4);
    }
#else
    for (int e = lid; e < n * HD4 * 4; e += items) {
        const int r = e / (HD4 * 4), d = e % (HD4 * 4);
        dst[r * LDR + d] = r0 + r < seq && d < HD ? x[(size_t)(r0 + r) * stride + d] : 0.0f;
    }
#endif
}

// keys j0 .. j0 + n - 1 of one kv head (0.0f past seq): k and v -> ks and vs, by the work-group's work-items
inline void stage_kv(__local float* ks, __local float* vs, const __global float* k, const __global float* v,
                     const int j0, const int n, const int seq, const size_t stride, const int lid, const int items) {
    stage_rows(ks, k, j0, n, seq, stride, lid, items);
    stage_rows(vs, v, j0, n, seq, stride, lid, items);
}

// the backward's query rows i0 .. i0 + n - 1 of one head (0.0f past seq): q and d_out -> qs and dos, their lse
// and D (lb, db: the head's rows) -> ls and ds
inline void stage_queries(__local float* qs, __local float* dos, __local float* ls, __local float* ds,
                          const __global float* q, const __global float* d_out, const __global float* lb,
                          const __global float* db, const int i0, const int n, const int seq, const size_t stride,
                          const int lid) {
    stage_rows(qs, q, i0, n, seq, stride, lid, BWG);
    stage_rows(dos, d_out, i0, n, seq, stride, lid, BWG);
    for (int r = lid; r < n; r += BWG) {
        ls[r] = i0 + r < seq ? lb[i0 + r] : 0.0f;
        ds[r] = i0 + r < seq ? db[i0 + r] : 0.0f;
    }
}

inline float4 lrow(__local const float* base, const int row, const int d4) {
    return vload4(0, base + row * LDR + d4 * 4);
}

// 1 of 3 on GPUs (attention_backward_dsum's d_sum): rows of d_out and out are read in memory order, (b, i, h) one
// after another, by DRL work-items a row (float4 each, consecutive: coalesced), whose partial sums the row's first
// work-item adds in order. rows = B * seq * n_heads. (The per-item kernel reads a row per work-item, rows
// n_heads * HD floats apart: 39 us a layer on an H100 at d1024's shape, 32 MB at 0.8 TB/s.)
#define P2UP(x) ((x) <= 1 ? 1 : (x) <= 2 ? 2 : (x) <= 4 ? 4 : (x) <= 8 ? 8 : (x) <= 16 ? 16 : 32)
#define P2DOWN(x) ((x) >= 32 ? 32 : (x) >= 16 ? 16 : (x) >= 8 ? 8 : (x) >= 4 ? 4 : (x) >= 2 ? 2 : 1)
#define DRL (P2UP(HD4) < P2DOWN(BWG) ? P2UP(HD4) : P2DOWN(BWG))  // work-items a row
__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void attention_backward_dsum_rows(__global float* d_sum, __global const float* d_out, __global const float* out,
                                  const int seq, const int n_heads, const int rows) {
    __local float part[BWG];
    const int lid = get_local_id(0), lane = lid % DRL;
    const int r = get_group_id(0) * (BWG / DRL) + lid / DRL;  // (b * seq + i) * n_heads + h
    const bool mine = lid < (BWG / DRL) * DRL && r < rows;
    float s = 0.0f;
    if (mine) {
        const __global float* x = d_out + (size_t)r * HD;
        const __global float* y = out + (size_t)r * HD;
        for (int d4 = lane; d4 < HD4; d4 += DRL) {
#if HD % 4 == 0
            s += dot(vload4(d4, x), vload4(d4, y));
#else
            for (int d = 4 * d4; d < 4 * d4 + 4 && d < HD; d++) s += x[d] * y[d];
#endif
        }
    }
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (mine && lane == 0) {
        float total = 0.0f;
        for (int e = 0; e < DRL; e++) total += part[lid + e];
        const int h = r % n_heads, bi = r / n_heads;  // bi = b * seq + i
        d_sum[((size_t)(bi / seq) * n_heads + h) * seq + bi % seq] = total;
    }
}

#ifdef FQ
#define FA 4                              // score micro-tile rows (and output micro-tile rows)
#if FK >= 8 && (FQ / FA) * (FK / 8) >= FWG  // score micro-tile keys: 8 where every work-item still gets a tile
#define FC 8                              // (4 x 8: 12 local float4 reads per 128 FMAs, where 4 x 4 reads 8 per 64)
#else
#define FC 4
#endif
#define LDS (FK + 4)                      // score tile row stride: float4-aligned rows, 4 banks apart
#define NMS ((FQ / FA) * (FK / FC))       // score micro-tiles
#define NMO ((FQ / FA) * HD8)             // output micro-tiles (FA rows x 8 columns)
#define MO ((NMO + FWG - 1) / FWG)        // output micro-tiles per work-item

// q (B, seq_q, n_heads, HD), k, v (B, >= seq_k, n_kv_heads, HD) -> out (B, seq_q, n_heads, HD),
// lse (B, n_heads, seq_q): as attention_forward, same arguments. Work-group (x, bh) owns query rows
// i0 .. i0+FQ-1 of (b, h), x = 0 the last block (the one with the most keys, so it starts first).
__kernel __attribute__((reqd_work_group_size(FWG, 1, 1)))
void attention_forward_tiled(__global float* out, __global float* lse, __global const float* q,
                             __global const float* k, __global const float* v, const int seq_q,
                             const int seq_k, const int q_pos_start, const int n_heads,
                             const int n_kv_heads, const float scale) {
    const int lid = get_local_id(0), bh = get_group_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = ((int)get_num_groups(0) - 1 - (int)get_group_id(0)) * FQ;
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const __global float* qb = q + (size_t)b * seq_q * q_stride + (size_t)h * HD;
    const __global float* kb = k + (size_t)b * seq_k * kv_stride + (size_t)kvh * HD;
    const __global float* vb = v + (size_t)b * seq_k * kv_stride + (size_t)kvh * HD;
    __local float qs[FQ * LDR], ks[FK * LDR], vs[FK * LDR], ss[FQ * LDS];
    __local float ms[FQ], ls[FQ], als[FQ];  // each row's running max and sum, and this block's rescale
    stage_rows(qs, qb, i0, FQ, seq_q, q_stride, lid, FWG);
    for (int r = lid; r < FQ; r += FWG) {
        ms[r] = -INFINITY;
        ls[r] = 0.0f;
    }
    float4 acc[MO][FA][2];  // output micro-tiles: rows t + a * FQ/FA, columns 8 * d8 .. 8 * d8 + 7
    _Pragma("unroll") for (int m = 0; m < MO; m++)
        _Pragma("unroll") for (int a = 0; a < FA; a++) acc[m][a][0] = acc[m][a][1] = (float4)(0.0f);
    const int last = i0 + FQ < seq_q ? i0 + FQ : seq_q;  // keys 0 .. n_keys-1 are visible to the block
    const int n_vis = q_pos_start + last;
    const int n_keys = n_vis < 0 ? 0 : (n_vis < seq_k ? n_vis : seq_k);

    for (int j0 = 0; j0 < n_keys; j0 += FK) {
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous block
        stage_kv(ks, vs, kb, vb, j0, FK, n_keys, kv_stride, lid, FWG);
        barrier(CLK_LOCAL_MEM_FENCE);
        // scores S = scale Q K^T of the block, -inf where masked: micro-tiles of FA rows x FC keys
        for (int e = lid; e < NMS; e += FWG) {
            const int ti = e / (FK / FC), tj = e % (FK / FC);
            float s[FA][FC];
            _Pragma("unroll") for (int a = 0; a < FA; a++)
                _Pragma("unroll") for (int c = 0; c < FC; c++) s[a][c] = 0.0f;
            for (int d4 = 0; d4 < HD4; d4++) {
                float4 qv[FA], kv[FC];
                _Pragma("unroll") for (int a = 0; a < FA; a++) qv[a] = lrow(qs, ti + a * (FQ / FA), d4);
                _Pragma("unroll") for (int c = 0; c < FC; c++) kv[c] = lrow(ks, tj + c * (FK / FC), d4);
                _Pragma("unroll") for (int a = 0; a < FA; a++)
                    _Pragma("unroll") for (int c = 0; c < FC; c++)
                        s[a][c] = s[a][c] + qv[a].x * kv[c].x + qv[a].y * kv[c].y + qv[a].z * kv[c].z
                                  + qv[a].w * kv[c].w;
            }
            _Pragma("unroll") for (int a = 0; a < FA; a++) {
                const int i = ti + a * (FQ / FA);
                _Pragma("unroll") for (int c = 0; c < FC; c++) {
                    const int j = tj + c * (FK / FC);
                    const bool vis = j0 + j < n_keys && j0 + j <= q_pos_start + i0 + i;
                    ss[i * LDS + j] = vis ? s[a][c] * scale : -INFINITY;
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        // one work-item per row: the running max and sum; the row's scores become P = exp(S - max)
        for (int r = lid; r < FQ; r += FWG) {
            __local float* row = ss + r * LDS;
            float4 x[FK / 4];
            float cm = -INFINITY;
            _Pragma("unroll") for (int c = 0; c < FK; c += 4) {
                union lanes4 u = {vload4(0, row + c)};
                x[c / 4] = u.v;
                _Pragma("unroll") for (int e = 0; e < 4; e++) cm = u.a[e] > cm ? u.a[e] : cm;
            }
            const float m_old = ms[r];
            const float mn = cm > m_old ? cm : m_old;
            const float msafe = mn == -INFINITY ? 0.0f : mn;  // nothing visible yet: all p are 0
            float sum = 0.0f;
            _Pragma("unroll") for (int c = 0; c < FK; c += 4) {
                const float4 p = exp(x[c / 4] - msafe);
                sum += (p.x + p.y) + (p.z + p.w);
                vstore4(p, 0, row + c);
            }
            const float alpha = exp(m_old - msafe);
            ls[r] = ls[r] * alpha + sum;
            ms[r] = mn;
            als[r] = alpha;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        // O = alpha O + P V: micro-tiles of FA rows x 8 columns
        _Pragma("unroll") for (int m = 0; m < MO; m++) {
            const int e = lid + m * FWG;
            if (e < NMO) {
                const int t = e % (FQ / FA), d8 = e / (FQ / FA);
                const bool two = 2 * d8 + 1 < HD4;  // the second column block lies inside the row
                _Pragma("unroll") for (int a = 0; a < FA; a++) {
                    const float al = als[t + a * (FQ / FA)];
                    acc[m][a][0] *= al;
                    acc[m][a][1] *= al;
                }
                for (int j = 0; j < FK; j += 4) {
                    union lanes4 p[FA];
                    _Pragma("unroll") for (int a = 0; a < FA; a++)
                        p[a].v = vload4(0, ss + (t + a * (FQ / FA)) * LDS + j);
                    _Pragma("unroll") for (int jj = 0; jj < 4; jj++) {
                        const float4 v0 = lrow(vs, j + jj, 2 * d8);
                        const float4 v1 = two ? lrow(vs, j + jj, 2 * d8 + 1) : (float4)(0.0f);
                        _Pragma("unroll") for (int a = 0; a < FA; a++) {
                            acc[m][a][0] += p[a].a[jj] * v0;
                            acc[m][a][1] += p[a].a[jj] * v1;
                        }
                    }
                }
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // (no block: the rows' initial max and sum)
    _Pragma("unroll") for (int m = 0; m < MO; m++) {  // out = O / l (0 where a row saw no key)
        const int e = lid + m * FWG;
        if (e < NMO) {
            const int t = e % (FQ / FA), d8 = e / (FQ / FA);
            _Pragma("unroll") for (int a = 0; a < FA; a++) {
                const int i = t + a * (FQ / FA);
                if (i0 + i < seq_q) {
                    const float l = ls[i], inv = l > 0.0f ? 1.0f / l : 0.0f;
                    union { float4 v[2]; float a[8]; } u = {{acc[m][a][0] * inv, acc[m][a][1] * inv}};
                    __global float* o = out + (size_t)b * seq_q * q_stride + (size_t)(i0 + i) * q_stride
                                        + (size_t)h * HD + 8 * d8;
                    _Pragma("unroll") for (int c = 0; c < 8; c++)
                        if (8 * d8 + c < HD) o[c] = u.a[c];
                }
            }
        }
    }
    for (int r = lid; r < FQ; r += FWG)
        if (i0 + r < seq_q) lse[(size_t)bh * seq_q + i0 + r] = ls[r] > 0.0f ? ms[r] + LOG_SUM(ls[r]) : -INFINITY;
}
#endif  // FQ

// The dK/dV kernels' work-group (x, y = get_group_id(1)): b, the query heads h0 .. h0 + heads - 1 it walks, their
// kv head kvh, and where its sums go: dk_out and dv_out (row stride out_stride floats). Without split: y = (b, kvh),
// every query head of the group, straight into d_k and d_v (B, seq, n_kv_heads, HD). With split: y = (b, h), one
// query head, into d_k as partials (B, seq, n_heads, 2 HD): each row's head h holds its dK then its dV, which
// attention_backward_kv_sum adds up per kv head (in head order: deterministic). Declares kv_base for the staging.
#define DKDV_SPLIT \
    const int y = get_group_id(1), group = n_heads / n_kv_heads, heads = split ? 1 : group; \
    const int b = y / (split ? n_heads : n_kv_heads); \
    const int h0 = split ? y % n_heads : (y % n_kv_heads) * group, kvh = h0 / group; \
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD; \
    const size_t kv_base = (size_t)b * seq * kv_stride + (size_t)kvh * HD; \
    const size_t out_stride = split ? 2 * q_stride : kv_stride; \
    __global float* dk_out = split ? d_k + (size_t)b * seq * out_stride + (size_t)h0 * 2 * HD : d_k + kv_base; \
    __global float* dv_out = split ? dk_out + HD : d_v + kv_base;

// Tile of P and dS for query rows i0.. and keys j0..: ps[i * LDQ + j], dss[i * LDQ + j] (query-major), or with
// kmajor ps[j * LDP + i], dss[j * LDP + i] (the dK/dV pass reads 4 query rows of a key at once); 0.0f where
// key j0 + j is masked for row i0 + i or either lies past seq. dS also to tile[i * BT + j] unless tile is 0.
inline void tile_p_ds(__local float* ps, __local float* dss, __local const float* qs,
                      __local const float* dos, __local const float* ks, __local const float* vs,
                      __local const float* ls, __local const float* ds, const int i0, const int j0,
                      const int seq, const float scale, const int lid, __global float* tile, const int kmajor) {
    for (int e = lid; e < NMT; e += BWG) {
        const int ti = e / (BT / TJ), tj = e % (BT / TJ);
        float sv[TI][TJ], dpv[TI][TJ];  // scalar sums of float4 products: 1/4 the registers of float4 sums
        _Pragma("unroll") for (int a = 0; a < TI; a++)
            _Pragma("unroll") for (int c = 0; c < TJ; c++) sv[a][c] = dpv[a][c] = 0.0f;
        for (int d4 = 0; d4 < HD4; d4++) {
            float4 qv[TI], dov[TI];
            _Pragma("unroll") for (int a = 0; a < TI; a++) {
                qv[a] = lrow(qs, ti + a * (BT / TI), d4);
                dov[a] = lrow(dos, ti + a * (BT / TI), d4);
            }
            _Pragma("unroll") for (int c = 0; c < TJ; c++) {
                const float4 kv = lrow(ks, tj + c * (BT / TJ), d4), vv = lrow(vs, tj + c * (BT / TJ), d4);
                _Pragma("unroll") for (int a = 0; a < TI; a++) {
                    sv[a][c] += dot(qv[a], kv);
                    dpv[a][c] += dot(dov[a], vv);
                }
            }
        }
        _Pragma("unroll") for (int a = 0; a < TI; a++) {
            const int i = ti + a * (BT / TI);
            _Pragma("unroll") for (int c = 0; c < TJ; c++) {
                const int j = tj + c * (BT / TJ);
                const bool ok = j0 + j <= i0 + i && i0 + i < seq && j0 + j < seq;
                const float p = ok ? exp(sv[a][c] * scale - ls[i]) : 0.0f, g = p * (dpv[a][c] - ds[i]);
                const int at = kmajor ? j * LDP + i : i * LDQ + j;
                ps[at] = p;
                dss[at] = g;
#ifdef DS_STORE
                if (tile) tile[i * BT + j] = g;
#endif
            }
        }
    }
}

// rows r0 + (e % (BT/TJ)) + c * BT/TJ (c < TJ), columns 4 * (e / (BT/TJ)) .. + 3 of a (BT, HD) block
// -> global x (stride floats between rows) times scale; rows past seq and columns past HD not stored
inline void store_micro(__global float* x, const float4* acc, const int e, const int r0, const int seq,
                        const size_t stride, const float scale) {
    if (e >= NMA) return;
    const int t = e % (BT / TJ), d = 4 * (e / (BT / TJ));
    _Pragma("unroll") for (int c = 0; c < TJ; c++) {
        const int r = r0 + t + c * (BT / TJ);
        if (r < seq) {
            const float4 v = acc[c] * scale;
            __global float* row = x + (size_t)r * stride + d;
            row[0] = v.x;
            if (d + 1 < HD) row[1] = v.y;
            if (d + 2 < HD) row[2] = v.z;
            if (d + 3 < HD) row[3] = v.w;
        }
    }
}

// dQ of a query block += dS K of one key block: each work-item's micro-tiles (rows t + c * BT/TJ, columns
// 4 d4 .. 4 d4 + 3) from the dS tile (dss) and the key block's rows (ks) in local memory
inline void add_ds_k(float4 dq[MA][TJ], __local const float* dss, __local const float* ks, const int lid) {
    _Pragma("unroll") for (int m = 0; m < MA; m++) {
        const int e = lid + m * BWG;
        const int t = e % (BT / TJ), d4 = e < NMA ? e / (BT / TJ) : 0;
        for (int j = 0; j < BT; j++) {
            const float4 kv = lrow(ks, j, d4);
            _Pragma("unroll") for (int c = 0; c < TJ; c++) dq[m][c] += dss[(t + c * (BT / TJ)) * LDQ + j] * kv;
        }
    }
}

// The stored dS (AttentionTiles.bwd_store): the BT x BT tiles of (query block ib, key block jb <= ib) of each
// (b, h) = bh, row-major, in the order bh, then ib, then jb: tile (bh, ib, jb) starts ds_tile(...) floats in.
inline size_t ds_tile(const int bh, const int ib, const int jb, const int seq) {
    const int nb = (seq + BT - 1) / BT;
    return ((size_t)bh * (nb * (nb + 1) / 2) + (size_t)ib * (ib + 1) / 2 + jb) * (BT * BT);
}

// One block pair of attention_backward_dkdv_tiled: P and dS of the query rows i0.. staged in qs, dos, ls, ds and the
// keys j0.. in ks, vs (dS also to tile unless it is 0), then dV += P^T dO and dK += dS^T Q into the work-item's
// micro-tiles (TJ keys x 4 columns each). Every work-item calls it (it holds a barrier).
inline void dkdv_block(float4 dk[MA][TJ], float4 dv[MA][TJ], __local float* ps, __local float* dss,
                       __local const float* qs, __local const float* dos, __local const float* ks,
                       __local const float* vs, __local const float* ls, __local const float* ds, const int i0,
                       const int j0, const int seq, const float scale, const int lid, __global float* tile) {
    tile_p_ds(ps, dss, qs, dos, ks, vs, ls, ds, i0, j0, seq, scale, lid, tile, 1);
    barrier(CLK_LOCAL_MEM_FENCE);
    _Pragma("unroll") for (int m = 0; m < MA; m++) {
        const int e = lid + m * BWG;
        const int t = e % (BT / TJ), d4 = e < NMA ? e / (BT / TJ) : 0;
#if BT >= 4  // 4 query rows of each key's P and dS at once (the tiles are key-major)
        for (int i = 0; i < BT; i += 4) {
            union lanes4 p[TJ], g[TJ];
            _Pragma("unroll") for (int c = 0; c < TJ; c++) {
                p[c].v = vload4(0, ps + (t + c * (BT / TJ)) * LDP + i);
                g[c].v = vload4(0, dss + (t + c * (BT / TJ)) * LDP + i);
            }
            _Pragma("unroll") for (int ii = 0; ii < 4; ii++) {
                const float4 dov = lrow(dos, i + ii, d4), qv = lrow(qs, i + ii, d4);
                _Pragma("unroll") for (int c = 0; c < TJ; c++) {
                    dv[m][c] += p[c].a[ii] * dov;
                    dk[m][c] += g[c].a[ii] * qv;
                }
            }
        }
#else
        for (int i = 0; i < BT; i++) {
            const float4 dov = lrow(dos, i, d4), qv = lrow(qs, i, d4);
            _Pragma("unroll") for (int c = 0; c < TJ; c++) {
                const int j = t + c * (BT / TJ);
                dv[m][c] += ps[j * LDP + i] * dov;
                dk[m][c] += dss[j * LDP + i] * qv;
            }
        }
#endif
    }
}

// The query block's prefetch (the dK/dV kernel, where it takes at most 16 floats of Q and as many of dO per
// work-item): rows i0 .. i0 + BT - 1 of one head's q and d_out (0.0f past seq and in columns HD ..), and their lse
// (lb) and D (db) -> registers, work-item lid holding elements lid, lid + BWG, ... of what stage_queries stages
#define QPER ((BT * HD4 * 4 + BWG - 1) / BWG)  // floats of a block of Q (and of dO) per work-item
#define LPER ((BT + BWG - 1) / BWG)            // rows' lse (and D) per work-item
#define Q_PREFETCH (QPER <= 16)
inline void fetch_queries(float* rq, float* rdo, float* rl, float* rd, const __global float* q,
                          const __global float* d_out, const __global float* lb, const __global float* db,
                          const int i0, const int seq, const size_t stride, const int lid) {
    _Pragma("unroll") for (int t = 0; t < QPER; t++) {
        const int e = lid + t * BWG, r = e / (HD4 * 4), d = e % (HD4 * 4);
        const bool in = e < BT * HD4 * 4 && i0 + r < seq && d < HD;
        rq[t] = in ? q[(size_t)(i0 + r) * stride + d] : 0.0f;
        rdo[t] = in ? d_out[(size_t)(i0 + r) * stride + d] : 0.0f;
    }
    _Pragma("unroll") for (int t = 0; t < LPER; t++) {
        const int r = lid + t * BWG;
        rl[t] = r < BT && i0 + r < seq ? lb[i0 + r] : 0.0f;
        rd[t] = r < BT && i0 + r < seq ? db[i0 + r] : 0.0f;
    }
}

// fetch_queries' registers -> qs, dos, ls, ds (as stage_queries stages them)
inline void put_queries(__local float* qs, __local float* dos, __local float* ls, __local float* ds, const float* rq,
                        const float* rdo, const float* rl, const float* rd, const int lid) {
    _Pragma("unroll") for (int t = 0; t < QPER; t++) {
        const int e = lid + t * BWG;
        if (e < BT * HD4 * 4) {
            qs[(e / (HD4 * 4)) * LDR + e % (HD4 * 4)] = rq[t];
            dos[(e / (HD4 * 4)) * LDR + e % (HD4 * 4)] = rdo[t];
        }
    }
    _Pragma("unroll") for (int t = 0; t < LPER; t++) {
        const int r = lid + t * BWG;
        if (r < BT) {
            ls[r] = rl[t];
            ds[r] = rd[t];
        }
    }
}

// as attention_backward_dkdv: -> d_k, d_v, overwritten. Work-group (x, y) owns keys x*BT .. x*BT+BT-1 of
// (b, kvh) = (y / n_kv_heads, y % n_kv_heads) and walks the query blocks that see them, for every query head
// of the group. With split (DKDV_SPLIT): y = (b, h), one query head each (n_heads / n_kv_heads times the
// work-groups, each a group's share of the work), partial sums -> d_k (see DKDV_SPLIT); d_v unused.
// Built with -DDS_STORE (AttentionTiles.bwd_store) and ds_off >= 0: each dS tile it computes also goes to
// ds_out + ds_off (ds_tile), for attention_backward_dq_stored (every tile of the store written, 0.0f where masked
// or past seq); otherwise ds_out and ds_off are unused.
__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void attention_backward_dkdv_tiled(__global float* d_k, __global float* d_v, const int split, __global float* ds_out,
                                   const int ds_off, BACKWARD_INPUTS) {
    const int lid = get_local_id(0);
    const int j0 = get_group_id(0) * BT;
    DKDV_SPLIT
    __local float ks[BT * LDR], vs[BT * LDR], qs[BT * LDR], dos[BT * LDR];
    __local float ps[BT * LDP], dss[BT * LDP], ls[BT], ds[BT];
    stage_kv(ks, vs, k + kv_base, v + kv_base, j0, BT, seq, kv_stride, lid, BWG);
    float4 dk[MA][TJ], dv[MA][TJ];
    _Pragma("unroll") for (int m = 0; m < MA; m++)
        _Pragma("unroll") for (int c = 0; c < TJ; c++) dk[m][c] = dv[m][c] = (float4)(0.0f);
#ifdef DS_STORE
#define DS_TILE(h, i0) (ds_off < 0 ? 0 : ds_out + ds_off + ds_tile(b * n_heads + (h), (i0) / BT, j0 / BT, seq))
#else
#define DS_TILE(h, i0) 0
#endif
#define Q_BASE(h) ((size_t)b * seq * q_stride + (size_t)(h) * HD)
#define ROWS_OF(x, h) ((x) + ((size_t)b * n_heads + (h)) * seq)  // the lse or D of query head h
#if Q_PREFETCH  // the next query block is fetched into registers while this one is used
    float rq[QPER], rdo[QPER], rl[LPER], rd[LPER];
    int h = h0, i0 = j0;
    fetch_queries(rq, rdo, rl, rd, q + Q_BASE(h), d_out + Q_BASE(h), ROWS_OF(lse, h), ROWS_OF(d_sum, h), i0, seq,
                  q_stride, lid);
    while (h < h0 + heads) {
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous query block
        put_queries(qs, dos, ls, ds, rq, rdo, rl, rd, lid);
        barrier(CLK_LOCAL_MEM_FENCE);
        const int nh = i0 + BT < seq ? h : h + 1, ni = i0 + BT < seq ? i0 + BT : j0;  // the next block
        if (nh < h0 + heads)
            fetch_queries(rq, rdo, rl, rd, q + Q_BASE(nh), d_out + Q_BASE(nh), ROWS_OF(lse, nh), ROWS_OF(d_sum, nh),
                          ni, seq, q_stride, lid);
        dkdv_block(dk, dv, ps, dss, qs, dos, ks, vs, ls, ds, i0, j0, seq, scale, lid, DS_TILE(h, i0));
        h = nh;
        i0 = ni;
    }
#else
    for (int h = h0; h < h0 + heads; h++) {
        for (int i0 = j0; i0 < seq; i0 += BT) {
            barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous query block
            stage_queries(qs, dos, ls, ds, q + Q_BASE(h), d_out + Q_BASE(h), ROWS_OF(lse, h), ROWS_OF(d_sum, h), i0,
                          BT, seq, q_stride, lid);
            barrier(CLK_LOCAL_MEM_FENCE);
            dkdv_block(dk, dv, ps, dss, qs, dos, ks, vs, ls, ds, i0, j0, seq, scale, lid, DS_TILE(h, i0));
        }
    }
#endif
#undef DS_TILE
#undef Q_BASE
#undef ROWS_OF
    _Pragma("unroll") for (int m = 0; m < MA; m++) {
        store_micro(dk_out, dk[m], lid + m * BWG, j0, seq, out_stride, scale);
        store_micro(dv_out, dv[m], lid + m * BWG, j0, seq, out_stride, 1.0f);
    }
}

// as attention_backward_dq: -> d_q, overwritten. Work-group (x, bh) owns query rows i0 .. i0+BT-1 of (b, h),
// x = 0 the last block (the most keys, so it starts first), and walks the key blocks they see.
__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void attention_backward_dq_tiled(__global float* d_q, BACKWARD_INPUTS) {
    const int lid = get_local_id(0), bh = get_group_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = ((int)get_num_groups(0) - 1 - (int)get_group_id(0)) * BT;
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const size_t q_base = (size_t)b * seq * q_stride + (size_t)h * HD;
    const size_t kv_base = (size_t)b * seq * kv_stride + (size_t)kvh * HD;
    __local float ks[BT * LDR], vs[BT * LDR], qs[BT * LDR], dos[BT * LDR];
    __local float ps[BT * LDQ], dss[BT * LDQ], ls[BT], ds[BT];
    stage_queries(qs, dos, ls, ds, q + q_base, d_out + q_base, lse + (size_t)bh * seq, d_sum + (size_t)bh * seq, i0,
                  BT, seq, q_stride, lid);
    float4 dq[MA][TJ];
    _Pragma("unroll") for (int m = 0; m < MA; m++)
        _Pragma("unroll") for (int c = 0; c < TJ; c++) dq[m][c] = (float4)(0.0f);
    const int last = i0 + BT < seq ? i0 + BT : seq;  // keys 0 .. last-1 are visible to the block
    for (int j0 = 0; j0 < last; j0 += BT) {
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous key block
        stage_kv(ks, vs, k + kv_base, v + kv_base, j0, BT, seq, kv_stride, lid, BWG);
        barrier(CLK_LOCAL_MEM_FENCE);
        tile_p_ds(ps, dss, qs, dos, ks, vs, ls, ds, i0, j0, seq, scale, lid, 0, 0);
        barrier(CLK_LOCAL_MEM_FENCE);
        add_ds_k(dq, dss, ks, lid);
    }
    _Pragma("unroll") for (int m = 0; m < MA; m++)
        store_micro(d_q + q_base, dq[m], lid + m * BWG, i0, seq, q_stride, scale);
}

#ifdef DS_STORE
// The stored-dS dQ pass (on an H100 at d1024's shape 4.36 -> 3.53 ms of a training step, against one query block
// a work-group and a float per dS read): a work-group owns two query blocks (DQ_ROWS = 2 BT rows), so each block of
// K it stages serves both, and each work-item adds DQR rows (t + c * DQT, c < DQR) x 4 columns (4 d4 ..) of dQ from float4 reads
// of 4 keys of a row of dS (rows of LDD = BT + 4 floats for BT >= 4: float4-aligned, the 8 rows a quarter warp
// reads 4 banks apart). The next key block's dS and K are fetched into registers while this one is used.
#define DQ_ROWS (2 * BT)
#define DQR (DQ_ROWS < 8 ? DQ_ROWS : 8)               // rows of a work-item's dQ micro-tile
#define DQT (DQ_ROWS / DQR)                          // micro-tiles down the rows
#define NMQ (DQT * HD4)                              // dQ micro-tiles (DQR rows x 4 columns)
#define MQ ((NMQ + BWG - 1) / BWG)                   // dQ micro-tiles per work-item
#define LDD (BT >= 4 ? BT + 4 : BT + 1)              // dS row stride
#define DS_PER ((DQ_ROWS * BT + BWG - 1) / BWG)      // floats of the two dS tiles per work-item
#define K_PER ((BT * HD4 * 4 + BWG - 1) / BWG)       // floats of a block of K per work-item

// key block jb of the stored dS of query blocks ib0 and ib0 + 1 of (b, h) = bh (0.0f where a block lies past the
// last or sees no key of jb) and of one kv head's K (kb; 0.0f past seq and in columns HD ..) -> registers: work-item
// lid holds elements lid, lid + BWG, ... of the (DQ_ROWS, BT) dS rows and of the (BT, HD4 * 4) K rows
inline void fetch_dq_block(float* rs, float* rk, const __global float* ds_in, const __global float* kb, const int bh,
                           const int ib0, const int jb, const int seq, const size_t kv_stride, const int lid) {
    const int nb = (seq + BT - 1) / BT;
    _Pragma("unroll") for (int t = 0; t < DS_PER; t++) {
        const int e = lid + t * BWG, r = e / BT, ib = ib0 + r / BT;
        rs[t] = e < DQ_ROWS * BT && ib < nb && jb <= ib ? ds_in[ds_tile(bh, ib, jb, seq) + (r % BT) * BT + e % BT]
                                                       : 0.0f;
    }
    _Pragma("unroll") for (int t = 0; t < K_PER; t++) {
        const int e = lid + t * BWG, r = e / (HD4 * 4), d = e % (HD4 * 4);
        rk[t] = e < BT * HD4 * 4 && jb * BT + r < seq && d < HD ? kb[(size_t)(jb * BT + r) * kv_stride + d] : 0.0f;
    }
}

// as attention_backward_dq_tiled, from the dS tiles attention_backward_dkdv_tiled stored (ds_in + ds_off, ds_tile):
// dQ = scale dS K with no scores recomputed (no Q, dO, V, lse or D read). Work-group (x, bh) owns query blocks
// ib0 = 2 p and ib0 + 1 of (b, h), p = num_groups(0) - 1 - x (the most keys first).
__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void attention_backward_dq_stored(__global float* d_q, __global const float* ds_in, const int ds_off,
                                  __global const float* k, const int seq, const int n_heads, const int n_kv_heads,
                                  const float scale) {
    const int lid = get_local_id(0), bh = get_group_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int ib0 = 2 * ((int)get_num_groups(0) - 1 - (int)get_group_id(0));
    const int nb = (seq + BT - 1) / BT, last = ib0 + 1 < nb ? ib0 + 1 : ib0;  // the last key block either sees
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const __global float* kb = k + (size_t)b * seq * kv_stride + (size_t)kvh * HD;
    ds_in += ds_off;
    __local float ks[BT * LDR], dss[DQ_ROWS * LDD];
    float4 dq[MQ][DQR];
    _Pragma("unroll") for (int m = 0; m < MQ; m++)
        _Pragma("unroll") for (int c = 0; c < DQR; c++) dq[m][c] = (float4)(0.0f);
    float rs[DS_PER], rk[K_PER];
    fetch_dq_block(rs, rk, ds_in, kb, bh, ib0, 0, seq, kv_stride, lid);
    for (int jb = 0; jb <= last; jb++) {
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous key block
        _Pragma("unroll") for (int t = 0; t < DS_PER; t++) {
            const int e = lid + t * BWG;
            if (e < DQ_ROWS * BT) dss[(e / BT) * LDD + e % BT] = rs[t];
        }
        _Pragma("unroll") for (int t = 0; t < K_PER; t++) {
            const int e = lid + t * BWG;
            if (e < BT * HD4 * 4) ks[(e / (HD4 * 4)) * LDR + e % (HD4 * 4)] = rk[t];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (jb < last) fetch_dq_block(rs, rk, ds_in, kb, bh, ib0, jb + 1, seq, kv_stride, lid);
        _Pragma("unroll") for (int m = 0; m < MQ; m++) {
            const int e = lid + m * BWG;
            const int t = e % DQT, d4 = e < NMQ ? e / DQT : 0;
#if BT >= 4
            for (int j = 0; j < BT; j += 4) {
                union lanes4 g[DQR];
                _Pragma("unroll") for (int c = 0; c < DQR; c++) g[c].v = vload4(0, dss + (t + c * DQT) * LDD + j);
                _Pragma("unroll") for (int jj = 0; jj < 4; jj++) {
                    const float4 kv = lrow(ks, j + jj, d4);
                    _Pragma("unroll") for (int c = 0; c < DQR; c++) dq[m][c] += g[c].a[jj] * kv;
                }
            }
#else
            for (int j = 0; j < BT; j++) {
                const float4 kv = lrow(ks, j, d4);
                _Pragma("unroll") for (int c = 0; c < DQR; c++) dq[m][c] += dss[(t + c * DQT) * LDD + j] * kv;
            }
#endif
        }
    }
    _Pragma("unroll") for (int m = 0; m < MQ; m++) {
        const int e = lid + m * BWG;
        if (e < NMQ) {
            const int t = e % DQT, d = 4 * (e / DQT);
            _Pragma("unroll") for (int c = 0; c < DQR; c++) {
                const int r = ib0 * BT + t + c * DQT;
                if (r < seq) {
                    const float4 v = dq[m][c] * scale;
                    __global float* row = d_q + (size_t)b * seq * q_stride + (size_t)r * q_stride + (size_t)h * HD + d;
                    row[0] = v.x;
                    if (d + 1 < HD) row[1] = v.y;
                    if (d + 2 < HD) row[2] = v.z;
                    if (d + 3 < HD) row[3] = v.w;
                }
            }
        }
    }
}
#endif  // DS_STORE

// ------------------------------------------------------------- backward, blocked (GPUs)
// The same gradients as the staged backward above, with blocks of BR query rows x BC keys (built with -DBR=...
// -DBC=..., powers of two >= 4, FlashAttention's B_r and B_c) and the forward's register micro-tiles: each
// work-item computes 4 x 4 entries of S and dP at once (scalar sums of float4 products: 16 local float4 reads
// per 32 four-term dot products), then adds 4 rows x 8 columns of dQ (or of dK and dV) from float4 reads of
// the dS (or P^T and dS^T) tile's rows and of the staged rows.
#ifdef BR
#define LDB (BC + 4)                      // dS tile row stride (dQ): float4-aligned rows, 4 banks apart
#define LDBT (BR + 4)                     // P^T / dS^T tile row stride (dK, dV)
#define NSB ((BR / 4) * (BC / 4))         // S / dP micro-tiles
#define NOQ ((BR / 4) * HD8)              // dQ micro-tiles (4 rows x 8 columns)
#define MOQ ((NOQ + BWG - 1) / BWG)
#define NOK ((BC / 4) * HD8)              // dK (and dV) micro-tiles
#define MOK ((NOK + BWG - 1) / BWG)

// S (unscaled) and dP = dO V^T of one micro-tile: rows ti + a * BR/4 of qs and dos, keys tj + c * BC/4 of ks, vs
inline void micro_s_dp(float s[4][4], float dp[4][4], __local const float* qs, __local const float* dos,
                       __local const float* ks, __local const float* vs, const int ti, const int tj) {
    _Pragma("unroll") for (int a = 0; a < 4; a++)
        _Pragma("unroll") for (int c = 0; c < 4; c++) s[a][c] = dp[a][c] = 0.0f;
    for (int d4 = 0; d4 < HD4; d4++) {
        float4 qv[4], dov[4];
        _Pragma("unroll") for (int a = 0; a < 4; a++) {
            qv[a] = lrow(qs, ti + a * (BR / 4), d4);
            dov[a] = lrow(dos, ti + a * (BR / 4), d4);
        }
        _Pragma("unroll") for (int c = 0; c < 4; c++) {  // one key's K and V rows at a time: fewer live registers
            const float4 kv = lrow(ks, tj + c * (BC / 4), d4), vv = lrow(vs, tj + c * (BC / 4), d4);
            _Pragma("unroll") for (int a = 0; a < 4; a++) {
                s[a][c] = s[a][c] + qv[a].x * kv.x + qv[a].y * kv.y + qv[a].z * kv.z + qv[a].w * kv.w;
                dp[a][c] = dp[a][c] + dov[a].x * vv.x + dov[a].y * vv.y + dov[a].z * vv.z + dov[a].w * vv.w;
            }
        }
    }
}

// P = exp(scale S - lse) and dS = P (dP - D) of micro-tile (ti, tj) of the block pair of query rows i0.. and keys
// j0.. (rows ti + a * BR/4, keys tj + c * BC/4): 0.0f where the key is masked for the row or either lies past seq
inline void micro_p_ds(float p[4][4], float g[4][4], __local const float* qs, __local const float* dos,
                       __local const float* ks, __local const float* vs, __local const float* ls,
                       __local const float* ds, const int ti, const int tj, const int i0, const int j0,
                       const int seq, const float scale) {
    float s[4][4], dp[4][4];
    micro_s_dp(s, dp, qs, dos, ks, vs, ti, tj);
    _Pragma("unroll") for (int a = 0; a < 4; a++) {
        const int i = ti + a * (BR / 4);
        _Pragma("unroll") for (int c = 0; c < 4; c++) {
            const int j = tj + c * (BC / 4);
            const bool ok = j0 + j <= i0 + i && i0 + i < seq && j0 + j < seq;
            p[a][c] = ok ? exp(s[a][c] * scale - ls[i]) : 0.0f;
            g[a][c] = p[a][c] * (dp[a][c] - ds[i]);
        }
    }
}

// 4 rows (r0 + t + c * n/4, c < 4; those below lim) x columns 8 * d8 .. 8 * d8 + 7 (those below HD) of acc
// times scale -> global x (stride floats between rows)
inline void store_micro8(__global float* x, float4 acc[4][2], const int t, const int d8, const int n, const int r0,
                         const int lim, const size_t stride, const float scale) {
    _Pragma("unroll") for (int c = 0; c < 4; c++) {
        const int r = r0 + t + c * (n / 4);
        if (r < lim) {
            union { float4 v[2]; float a[8]; } u = {{acc[c][0] * scale, acc[c][1] * scale}};
            __global float* row = x + (size_t)r * stride + 8 * d8;
            _Pragma("unroll") for (int e = 0; e < 8; e++)
                if (8 * d8 + e < HD) row[e] = u.a[e];
        }
    }
}

// as attention_backward_dkdv_tiled (split and stored dS included): -> d_k, d_v. Work-group (x, y) owns keys
// j0 .. j0+BC-1 of (b, kvh) and walks the blocks of BR query rows that see them, for every query head of the group
// (with split: of its one query head). With -DDS_STORE (blocks of BR = BC = BT only) and ds_off >= 0 each dS block
// also goes to ds_out + ds_off (ds_tile) for attention_backward_dq_stored, as the staged kernel's.
#if defined(DS_STORE) && (BR != BT || BC != BT)
#error "the stored dS of the blocked backward needs blocks of BT x BT"
#endif
__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void attention_backward_dkdv_blocked(__global float* d_k, __global float* d_v, const int split, __global float* ds_out,
                                     const int ds_off, BACKWARD_INPUTS) {
    const int lid = get_local_id(0);
    const int j0 = get_group_id(0) * BC;  // group 0 (the most query rows) first
    DKDV_SPLIT
    __local float ks[BC * LDR], vs[BC * LDR], qs[BR * LDR], dos[BR * LDR];
    __local float pt[BC * LDBT], dst[BC * LDBT], ls[BR], ds[BR];  // P^T, dS^T of the block pair; lse, D
    stage_kv(ks, vs, k + kv_base, v + kv_base, j0, BC, seq, kv_stride, lid, BWG);
    float4 dk[MOK][4][2], dv[MOK][4][2];
    _Pragma("unroll") for (int m = 0; m < MOK; m++)
        _Pragma("unroll") for (int c = 0; c < 4; c++)
            dk[m][c][0] = dk[m][c][1] = dv[m][c][0] = dv[m][c][1] = (float4)(0.0f);
    for (int h = h0; h < h0 + heads; h++) {
        const size_t q_base = (size_t)b * seq * q_stride + (size_t)h * HD;
        const __global float* lb = lse + ((size_t)b * n_heads + h) * seq;
        const __global float* db = d_sum + ((size_t)b * n_heads + h) * seq;
        for (int i0 = j0 / BR * BR; i0 < seq; i0 += BR) {  // the query blocks with a row i >= j0
            barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous query block
            stage_queries(qs, dos, ls, ds, q + q_base, d_out + q_base, lb, db, i0, BR, seq, q_stride, lid);
            barrier(CLK_LOCAL_MEM_FENCE);
#ifdef DS_STORE
            __global float* tile = ds_off < 0 ? 0 : ds_out + ds_off + ds_tile(b * n_heads + h, i0 / BT, j0 / BT, seq);
#endif
            for (int e = lid; e < NSB; e += BWG) {  // P^T and dS^T of the block pair
                const int ti = e / (BC / 4), tj = e % (BC / 4);
                float p[4][4], g[4][4];
                micro_p_ds(p, g, qs, dos, ks, vs, ls, ds, ti, tj, i0, j0, seq, scale);
                _Pragma("unroll") for (int a = 0; a < 4; a++)
                    _Pragma("unroll") for (int c = 0; c < 4; c++) {
                        pt[(tj + c * (BC / 4)) * LDBT + ti + a * (BR / 4)] = p[a][c];
                        dst[(tj + c * (BC / 4)) * LDBT + ti + a * (BR / 4)] = g[a][c];
#ifdef DS_STORE
                        if (tile) tile[(ti + a * (BR / 4)) * BT + tj + c * (BC / 4)] = g[a][c];
#endif
                    }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            _Pragma("unroll") for (int m = 0; m < MOK; m++) {  // dV += P^T dO, dK += dS^T Q
                const int e = lid + m * BWG;
                if (e < NOK) {
                    const int t = e % (BC / 4), d8 = e / (BC / 4);
                    const bool two = 2 * d8 + 1 < HD4;  // the second column block lies inside the row
                    for (int i = 0; i < BR; i += 4) {
                        union lanes4 p[4], g[4];
                        _Pragma("unroll") for (int c = 0; c < 4; c++) {
                            p[c].v = vload4(0, pt + (t + c * (BC / 4)) * LDBT + i);
                            g[c].v = vload4(0, dst + (t + c * (BC / 4)) * LDBT + i);
                        }
                        _Pragma("unroll") for (int ii = 0; ii < 4; ii++) {
                            const float4 do0 = lrow(dos, i + ii, 2 * d8), q0 = lrow(qs, i + ii, 2 * d8);
                            const float4 do1 = two ? lrow(dos, i + ii, 2 * d8 + 1) : (float4)(0.0f);
                            const float4 q1 = two ? lrow(qs, i + ii, 2 * d8 + 1) : (float4)(0.0f);
                            _Pragma("unroll") for (int c = 0; c < 4; c++) {
                                dv[m][c][0] += p[c].a[ii] * do0;
                                dv[m][c][1] += p[c].a[ii] * do1;
                                dk[m][c][0] += g[c].a[ii] * q0;
                                dk[m][c][1] += g[c].a[ii] * q1;
                            }
                        }
                    }
                }
            }
        }
    }
    _Pragma("unroll") for (int m = 0; m < MOK; m++) {
        const int e = lid + m * BWG;
        if (e < NOK) {
            store_micro8(dk_out, dk[m], e % (BC / 4), e / (BC / 4), BC, j0, seq, out_stride, scale);
            store_micro8(dv_out, dv[m], e % (BC / 4), e / (BC / 4), BC, j0, seq, out_stride, 1.0f);
        }
    }
}

// as attention_backward_dq: -> d_q, overwritten. Work-group (x, bh) owns query rows i0 .. i0+BR-1 of (b, h),
// x = 0 the last block (the most keys), and walks the blocks of BC keys they see.
__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void attention_backward_dq_blocked(__global float* d_q, BACKWARD_INPUTS) {
    const int lid = get_local_id(0), bh = get_group_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = ((int)get_num_groups(0) - 1 - (int)get_group_id(0)) * BR;
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const size_t q_base = (size_t)b * seq * q_stride + (size_t)h * HD;
    const size_t kv_base = (size_t)b * seq * kv_stride + (size_t)kvh * HD;
    __local float qs[BR * LDR], dos[BR * LDR], ks[BC * LDR], vs[BC * LDR], dss[BR * LDB], ls[BR], ds[BR];
    stage_queries(qs, dos, ls, ds, q + q_base, d_out + q_base, lse + (size_t)bh * seq, d_sum + (size_t)bh * seq, i0,
                  BR, seq, q_stride, lid);
    float4 dq[MOQ][4][2];
    _Pragma("unroll") for (int m = 0; m < MOQ; m++)
        _Pragma("unroll") for (int c = 0; c < 4; c++) dq[m][c][0] = dq[m][c][1] = (float4)(0.0f);
    const int last = i0 + BR < seq ? i0 + BR : seq;  // keys 0 .. last-1 are visible to the block
    for (int j0 = 0; j0 < last; j0 += BC) {
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous key block
        stage_kv(ks, vs, k + kv_base, v + kv_base, j0, BC, seq, kv_stride, lid, BWG);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = lid; e < NSB; e += BWG) {  // dS of the block pair
            const int ti = e / (BC / 4), tj = e % (BC / 4);
            float p[4][4], g[4][4];
            micro_p_ds(p, g, qs, dos, ks, vs, ls, ds, ti, tj, i0, j0, seq, scale);
            _Pragma("unroll") for (int a = 0; a < 4; a++)
                _Pragma("unroll") for (int c = 0; c < 4; c++)
                    dss[(ti + a * (BR / 4)) * LDB + tj + c * (BC / 4)] = g[a][c];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        _Pragma("unroll") for (int m = 0; m < MOQ; m++) {  // dQ += dS K
            const int e = lid + m * BWG;
            if (e < NOQ) {
                const int t = e % (BR / 4), d8 = e / (BR / 4);
                const bool two = 2 * d8 + 1 < HD4;
                for (int j = 0; j < BC; j += 4) {
                    union lanes4 g[4];
                    _Pragma("unroll") for (int a = 0; a < 4; a++)
                        g[a].v = vload4(0, dss + (t + a * (BR / 4)) * LDB + j);
                    _Pragma("unroll") for (int jj = 0; jj < 4; jj++) {
                        const float4 k0 = lrow(ks, j + jj, 2 * d8);
                        const float4 k1 = two ? lrow(ks, j + jj, 2 * d8 + 1) : (float4)(0.0f);
                        _Pragma("unroll") for (int a = 0; a < 4; a++) {
                            dq[m][a][0] += g[a].a[jj] * k0;
                            dq[m][a][1] += g[a].a[jj] * k1;
                        }
                    }
                }
            }
        }
    }
    _Pragma("unroll") for (int m = 0; m < MOQ; m++) {
        const int e = lid + m * BWG;
        if (e < NOQ) store_micro8(d_q + q_base, dq[m], e % (BR / 4), e / (BR / 4), BR, i0, seq, q_stride, scale);
    }
}
#endif  // BR
#endif  // BT
