/* Per-token multi-LoRA for a fused linear layer in bf16, for vLLM's CPU backend.

   y[t, cols of slice s] += scale * (x[t] . A[a_t, rows of s]) B[a_t, rows of s]
   for every token t with an adapter (a_t = index[t] >= 0) and every slice s of the layer
   (q/k/v, gate/up, or one).

   Why a kernel of its own: with a population of adapters a decode step has a few tokens per
   adapter, and PyTorch's batched matmuls then spend a fixed ~17 us per small bf16 product
   and a gather per scattered token. Here each token reads its adapter's rows directly and
   accumulates in fp32, rounding to bf16 once when it adds to y. Compiled at first use by
   cpu_lora_native.py with -O3 -march=native; GCC vector extensions let the compiler use
   the host's vector registers (8 floats with AVX2, 16 with AVX-512). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One vector register of floats: wider vectors than the host's would spill. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float floats __attribute__((vector_size(LANES * 4)));
typedef uint32_t words __attribute__((vector_size(LANES * 4)));
typedef uint16_t halves __attribute__((vector_size(LANES * 2)));

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's .to(torch.bfloat16); NaN stays NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline floats load_bf16(const uint16_t *p) {
    halves h;
    memcpy(&h, p, sizeof h);
    words u = __builtin_convertvector(h, words) << 16;
    floats f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void store_bf16(uint16_t *p, floats f) {
    words u;
    memcpy(&u, &f, sizeof u);
    words nan = (u & 0x7fffffffu) > 0x7f800000u;
    words rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    u = (rounded & ~nan) | (((u >> 16) | 0x40u) & nan);
    halves h = __builtin_convertvector(u, halves);
    memcpy(p, &h, sizeof h);
}

static inline float sum_lanes(floats v) {
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += v[l];
    return s;
}

#define MAX_ROWS 256 /* slices * rank: 3 slices of rank 64 fit */
#define TILE 4 /* tokens of one adapter computed together: each weight is read once */

/* shrunk[j][k] = scale * x[j] . a[k] for the TILE tokens j and rows k < rows; a is [rows, in]
   bf16, x[j] fp32 rows. */
static void shrink(const float *const x[TILE], const uint16_t *a, int64_t in, int64_t rows,
                   float scale, float shrunk[TILE][MAX_ROWS]) {
    int64_t body = in - in % LANES;
    for (int64_t k = 0; k < rows; k++) {
        const uint16_t *ak = a + k * in;
        floats acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
        for (int64_t i = 0; i < body; i += LANES) {
            floats w = load_bf16(ak + i), x0, x1, x2, x3;
            memcpy(&x0, x[0] + i, sizeof w);
            memcpy(&x1, x[1] + i, sizeof w);
            memcpy(&x2, x[2] + i, sizeof w);
            memcpy(&x3, x[3] + i, sizeof w);
            acc0 += x0 * w;
            acc1 += x1 * w;
            acc2 += x2 * w;
            acc3 += x3 * w;
        }
        float sums[TILE] = {sum_lanes(acc0), sum_lanes(acc1), sum_lanes(acc2), sum_lanes(acc3)};
        for (int64_t i = body; i < in; i++) {
            float w = bf16_to_float(ak[i]);
            for (int j = 0; j < TILE; j++) sums[j] += x[j][i] * w;
        }
        for (int j = 0; j < TILE; j++) shrunk[j][k] = scale * sums[j];
    }
}

/* y[j][c] += sum_k shrunk[j][k] b[k, c] for c in [first, last) and the n <= TILE tokens j;
   b is [rank, out] bf16 (a slice's rows). */
static void expand(float shrunk[TILE][MAX_ROWS], int64_t offset, const uint16_t *b,
                   int64_t out, int64_t rank, int64_t first, int64_t last, uint16_t *const y[TILE],
                   int n) {
    int64_t c = first;
    for (; c + LANES <= last; c += LANES) {
        floats acc[TILE];
        for (int j = 0; j < n; j++) acc[j] = load_bf16(y[j] + c);
        for (int64_t k = 0; k < rank; k++) {
            floats w = load_bf16(b + k * out + c);
            for (int j = 0; j < n; j++) acc[j] += shrunk[j][offset + k] * w;
        }
        for (int j = 0; j < n; j++) store_bf16(y[j] + c, acc[j]);
    }
    for (; c < last; c++)
        for (int j = 0; j < n; j++) {
            float acc = bf16_to_float(y[j][c]);
            for (int64_t k = 0; k < rank; k++)
                acc += shrunk[j][offset + k] * bf16_to_float(b[k * out + c]);
            y[j][c] = float_to_bf16(acc);
        }
}

/* x [tokens, in] (rows x_stride apart), y [tokens, out] (rows y_stride apart), index
   [tokens] (-1: no adapter), a [adapters, slices * rank, in], b [adapters, slices * rank,
   out] whose slice s uses rows s*rank.. and columns bounds[s]..bounds[s + 1]. Consecutive
   tokens of one adapter (a member's sequences in a decode step) go in tiles of up to TILE;
   with OpenMP the tiles are split between threads. Returns 0; -1 when slices * rank exceeds
   MAX_ROWS, -2 when scratch space could not be allocated (nothing is written then). */
int lora_tokens(const uint16_t *x, int64_t x_stride, uint16_t *y, int64_t y_stride,
                const int64_t *index, int64_t tokens, const uint16_t *a, const uint16_t *b,
                int64_t in, int64_t out, int64_t slices, int64_t rank, const int64_t *bounds,
                float scale) {
    int64_t rows = slices * rank;
    if (rows > MAX_ROWS) return -1;
    int64_t *tiles = malloc((size_t)(tokens + 1) * sizeof(int64_t));
    if (tiles == NULL) return -2;
    int64_t count = 0;
    for (int64_t t = 0; t < tokens;) {
        int64_t end = t + 1;
        while (end < tokens && end - t < TILE && index[end] == index[t]) end++;
        if (index[t] >= 0) tiles[count++] = t | ((end - t) << 56);
        t = end;
    }
    int failed = 0;
#pragma omp parallel if (count * TILE * rows * in > (1 << 18)) reduction(|: failed)
    {
        float *scratch = malloc((size_t)(TILE * in) * sizeof(float));
        if (scratch == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < count; i++) {
            if (scratch == NULL) continue;
            int64_t first = tiles[i] & ((INT64_C(1) << 56) - 1);
            int n = (int)(tiles[i] >> 56);
            const float *xs[TILE];
            uint16_t *ys[TILE];
            for (int j = 0; j < TILE; j++) {
                int64_t t = first + (j < n ? j : n - 1); /* a short tile repeats its last */
                float *row = scratch + j * in;
                for (int64_t f = 0; f < in; f++) row[f] = bf16_to_float(x[t * x_stride + f]);
                xs[j] = row;
                ys[j] = y + t * y_stride;
            }
            float shrunk[TILE][MAX_ROWS];
            int64_t adapter = index[first];
            shrink(xs, a + adapter * rows * in, in, rows, scale, shrunk);
            const uint16_t *ba = b + adapter * rows * out;
            for (int64_t s = 0; s < slices; s++)
                expand(shrunk, s * rank, ba + s * rank * out, out, rank, bounds[s],
                       bounds[s + 1], ys, n);
        }
        free(scratch);
    }
    free(tiles);
    return failed ? -2 : 0;
}
