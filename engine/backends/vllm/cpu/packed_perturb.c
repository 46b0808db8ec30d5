/* out := pack(snapshot + scale * eps) for a bf16 weight stored in SGL's VNNI layout
 * (engine/backends/vllm/cpu/packed.py).
 *
 * The snapshot and the noise are in the logical layout: row i of the n x k snapshot is
 * snapshot[i * k ...], and its noise is table[noise_rows[i] ...], k entries in a row (a
 * tensor-parallel shard's rows lie anywhere in the whole tensor's noise block). The output is
 * packed: blocks of `block` logical rows, each stored as [k / 2][block][2], so that entry
 * (b * block + r, 2 j + t) of the logical weight is out[((b * k / 2 + j) * block + r) * 2 + t].
 *
 * Every entry gets what torch.addcmul(snapshot, eps, 1, value=scale) gives in the logical
 * layout on the CPU (engine/noise.py perturb_): the product scale * eps and the sum rounded
 * to fp32 one after the other (built with -ffp-contract=off, so never one fused
 * multiply-add), then rounded to bf16 to nearest even, NaN as torch's 0x7fc0. So a packed
 * engine draws the perturbation of an unpacked one bit for bit.
 *
 * Per block of rows: the rows are computed into a scratch tile in the logical order, where
 * the loops vectorise and each row streams from memory once, then the tile is written to the
 * packed block as pairs of bf16 (one uint32 each), transposed 8 x 8 at a time with AVX2.
 * Returns 0, or 1 where the scratch tile could not be allocated. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

static inline uint16_t perturbed(uint16_t snapshot, uint16_t eps, float scale) {
    uint32_t s_bits = (uint32_t)snapshot << 16, e_bits = (uint32_t)eps << 16, bits;
    float s, e, sum;
    memcpy(&s, &s_bits, 4);
    memcpy(&e, &e_bits, 4);
    float product = scale * e;
    sum = s + product;
    memcpy(&bits, &sum, 4);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)(((bits & 0x7fffffffu) > 0x7f800000u) ? 0x7fc0u : rounded);
}

#ifdef __AVX2__
/* d[j * dst_stride + r] = s[r * src_stride + j] for an 8 x 8 block of uint32 */
static inline void transpose8(const uint32_t *s, int64_t src_stride, uint32_t *d,
                              int64_t dst_stride) {
    __m256i r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(s + i * src_stride));
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_si256((__m256i *)(d + i * dst_stride),
                            _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
        _mm256_storeu_si256((__m256i *)(d + (i + 4) * dst_stride),
                            _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
    }
}
#endif

int eslab_perturb_packed(uint16_t *restrict out, const uint16_t *restrict snapshot,
                         const uint16_t *restrict table, const int64_t *restrict noise_rows,
                         int64_t noise_offset, int64_t n, int64_t k, int64_t block,
                         float scale) {
    const int64_t blocks = n / block, pairs = k / 2;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        uint32_t *tile = malloc(sizeof(uint32_t) * (size_t)(block * pairs));
        if (tile == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            if (tile == NULL) continue;
            for (int64_t r = 0; r < block; r++) {
                const int64_t i = b * block + r;
                const uint16_t *s = snapshot + i * k;
                const uint16_t *e = table + noise_offset + noise_rows[i];
                uint16_t *row = (uint16_t *)(tile + r * pairs);
                for (int64_t c = 0; c < k; c++) row[c] = perturbed(s[c], e[c], scale);
            }
            uint32_t *packed = (uint32_t *)out + b * pairs * block;
            int64_t j = 0;
#ifdef __AVX2__
            if (block % 8 == 0)
                for (; j + 8 <= pairs; j += 8)
                    for (int64_t r = 0; r < block; r += 8)
                        transpose8(tile + r * pairs + j, pairs, packed + j * block + r, block);
#endif
            for (; j < pairs; j++)
                for (int64_t r = 0; r < block; r++) packed[j * block + r] = tile[r * pairs + j];
        }
        free(tile);
    }
    return failed;
}
