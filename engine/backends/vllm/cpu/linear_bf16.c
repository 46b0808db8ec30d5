/* out := round_bf16(x w^T + bias) for bf16 x [m, k] and bf16 w [n, k], the products and sums
 * in fp32: the linear layers of a bf16 model on CPUs without bf16 matmul hardware
 * (engine/backends/vllm/cpu/weights.py, `_linear_in_fp32`), reading the bf16 weight as it is.
 *
 * Why not torch's fp32 matmul (MKL) on fp32 copies of the weights: at decode sizes (16 rows)
 * MKL's sgemm reaches a third of an AVX2 core's FMA rate, it reads fp32 copies (twice the
 * bytes of the bf16 weights, kept and refreshed after every write), and it rounds a row
 * differently in short batches, so rows are padded to 16 to keep a sequence's output
 * independent of its batch: a decode step costs what 16 rows do (docs/benchmarks.md, "The
 * fp32 linear layers: MKL against a kernel reading bf16").
 *
 * Every output entry is computed the same way whatever m, n, the row's place in the batch or
 * the thread count: eight fp32 lanes, lane l accumulating x[i, 8 c + l] * w[j, 8 c + l] for
 * c = 0, 1, ... by fused multiply-adds, then the lanes summed in one fixed order, the bias
 * added and the sum rounded to bf16 (to nearest even, NaN as torch's 0x7fc0). So a row gives
 * the same bits alone or in any batch, and tiles, blocks and threads only decide which entries
 * are computed together. bf16 to fp32 is exact (a shift), so whether a weight row is widened
 * into a scratch buffer first (more than TILE_ROWS rows, where it is reused) or as it is read
 * changes no bit either.
 *
 * k must be a multiple of 8 (the caller checks). Returns 0, or 1 where scratch space could not
 * be allocated. */
#include <stdint.h>
#include <stdlib.h>
#if !defined(__AVX2__) || !defined(__FMA__)
#error "linear_bf16.c needs AVX2 and FMA"
#endif
#include <immintrin.h>

#define TILE_ROWS 4  /* rows of x a tile computes at once */
#define TILE_COLS 3  /* rows of w: 12 accumulators, 3 weight and 1 input register of 16 */
#define BLOCK_N 24   /* rows of w a thread takes at once (a multiple of TILE_COLS) */
#define CHUNK_BYTES (128 * 1024) /* rows of widened x a block runs over at once: L2-sized */

/* Keeps v in a register: without it GCC folds the load of a tile's input and weight vectors
 * into every multiply-add that uses them (a load per FMA), which two load ports cannot feed
 * (measured on an AVX2 build, 4 x 3 tiles: 60-70 GFLOP/s with, 86-96 without, of ~115). */
#define IN_REGISTER(v) __asm__("" : "+x"(v))

static inline __m256 widen8(const uint16_t *bf16) {
    __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)bf16));
    return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
}

static inline void widen_row(const uint16_t *src, float *dst, int64_t k) {
    for (int64_t c = 0; c < k; c += 8) _mm256_storeu_ps(dst + c, widen8(src + c));
}

static inline float sum_lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline uint16_t to_bf16(float value) {
    uint32_t bits;
    __builtin_memcpy(&bits, &value, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* rows x cols outputs. x: rows rows of widened input, k apart. The weight rows are either
 * widened (wide, k apart) or bf16 (narrow, ldw apart); `widened` says which. Inlined with
 * constant rows, cols and widened, so the loops unroll into registers. */
static inline __attribute__((always_inline)) void tile(
    const float *x, const float *wide, const uint16_t *narrow, int64_t ldw, int widened,
    int64_t k, const float *bias, uint16_t *out, int64_t ldo, int rows, int cols) {
    __m256 acc[TILE_ROWS][TILE_COLS];
    for (int i = 0; i < TILE_ROWS; i++)
        for (int j = 0; j < TILE_COLS; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 8) {
        __m256 w[TILE_COLS];
        for (int j = 0; j < cols; j++) {
            w[j] = widened ? _mm256_loadu_ps(wide + j * k + c) : widen8(narrow + j * ldw + c);
            IN_REGISTER(w[j]);
        }
        for (int i = 0; i < rows; i++) {
            __m256 xi = _mm256_loadu_ps(x + i * k + c);
            IN_REGISTER(xi);
            for (int j = 0; j < cols; j++) acc[i][j] = _mm256_fmadd_ps(xi, w[j], acc[i][j]);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float sum = sum_lanes(acc[i][j]);
            if (bias != NULL) sum += bias[j];
            out[i * ldo + j] = to_bf16(sum);
        }
}

#define TILE(rows, cols)                                                       \
    (widened ? tile(x, wide, narrow, ldw, 1, k, bias, out, ldo, rows, cols)    \
             : tile(x, wide, narrow, ldw, 0, k, bias, out, ldo, rows, cols))

static void any_tile(const float *x, const float *wide, const uint16_t *narrow, int64_t ldw,
                     int widened, int64_t k, const float *bias, uint16_t *out, int64_t ldo,
                     int rows, int cols) {
    if (cols == TILE_COLS) {
        switch (rows) {
        case 4: TILE(4, 3); return;
        case 3: TILE(3, 3); return;
        case 2: TILE(2, 3); return;
        default: TILE(1, 3); return;
        }
    }
    for (int i = 0; i < rows; i++)  /* the last columns of a block: one entry at a time */
        for (int j = 0; j < cols; j++) {
            const float *xi = x + i * k, *wj = widened ? wide + j * k : NULL;
            const float *bj = bias != NULL ? bias + j : NULL;
            tile(xi, wj, narrow + j * ldw, ldw, widened, k, bj, out + i * ldo + j, ldo, 1, 1);
        }
}

int eslab_linear_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw,
                      const float *bias, uint16_t *out, int64_t ldo, int64_t m, int64_t n,
                      int64_t k) {
    if (m == 0 || n == 0) return 0;
    float *xs = malloc(sizeof(float) * (size_t)(m * k));
    if (xs == NULL) return 1;
    for (int64_t i = 0; i < m; i++) widen_row(x + i * ldx, xs + i * k, k);
    const int widened = m > TILE_ROWS; /* a widened weight row is then read again */
    int64_t chunk = CHUNK_BYTES / (4 * k);
    chunk = chunk < TILE_ROWS ? TILE_ROWS : chunk - chunk % TILE_ROWS;
    const int64_t blocks = (n + BLOCK_N - 1) / BLOCK_N;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *ws = widened ? malloc(sizeof(float) * (size_t)(BLOCK_N * k)) : NULL;
        if (widened && ws == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            if (widened && ws == NULL) continue;
            const int64_t n0 = b * BLOCK_N, n1 = n0 + BLOCK_N < n ? n0 + BLOCK_N : n;
            if (widened)
                for (int64_t j = n0; j < n1; j++) widen_row(w + j * ldw, ws + (j - n0) * k, k);
            for (int64_t m0 = 0; m0 < m; m0 += chunk) {
                const int64_t m1 = m0 + chunk < m ? m0 + chunk : m;
                for (int64_t j = n0; j < n1; j += TILE_COLS) {
                    const int cols = n1 - j < TILE_COLS ? (int)(n1 - j) : TILE_COLS;
                    const float *wide = widened ? ws + (j - n0) * k : NULL;
                    const float *bj = bias != NULL ? bias + j : NULL;
                    for (int64_t i = m0; i < m1; i += TILE_ROWS) {
                        const int rows = m1 - i < TILE_ROWS ? (int)(m1 - i) : TILE_ROWS;
                        any_tile(xs + i * k, wide, w + j * ldw, ldw, widened, k, bj,
                                 out + i * ldo + j, ldo, rows, cols);
                    }
                }
            }
        }
        free(ws);
    }
    free(xs);
    return failed;
}
