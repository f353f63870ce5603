/* numpy-exact draw of RandomResizedCrop's box and the flip of one sample: see the header. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_crop_draw.h"

/* numpy.random.SeedSequence (bit_generator.pyx): pool of 4 uint32 words, hashmix and mix. */
#define POOL 4
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u
#define XSHIFT 16

static uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= MULT_A;
    value *= *hash_const;
    value ^= value >> XSHIFT;
    return value;
}

static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = MIX_MULT_L * x - MIX_MULT_R * y;
    return result ^ (result >> XSHIFT);
}

/* The uint32 words numpy makes of non-negative integers: each one's 32-bit chunks, low first
 * (0 as one word). At most 2 words each: values below 2^64. */
static int entropy_words(const uint64_t *values, int count, uint32_t *words) {
    int n = 0, i;
    for (i = 0; i < count; i++) {
        uint64_t v = values[i];
        if (v == 0)
            words[n++] = 0;
        while (v > 0) {
            words[n++] = (uint32_t)(v & 0xffffffffu);
            v >>= 32;
        }
    }
    return n;
}

static void seed_state(const uint64_t *values, int count, uint64_t out[4]) {
    uint32_t entropy[2 * CROP_DRAW_MAX_KEYS], pool[POOL], hash_const = INIT_A, words[8];
    int n = entropy_words(values, count, entropy), i, src, dst;
    for (i = 0; i < POOL; i++)
        pool[i] = hashmix(i < n ? entropy[i] : 0, &hash_const);
    for (src = 0; src < POOL; src++)
        for (dst = 0; dst < POOL; dst++)
            if (src != dst)
                pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
    for (src = POOL; src < n; src++)
        for (dst = 0; dst < POOL; dst++)
            pool[dst] = mix(pool[dst], hashmix(entropy[src], &hash_const));
    /* generate_state(4, uint64): 8 words cycling over the pool, viewed as little-endian uint64 */
    hash_const = INIT_B;
    for (i = 0; i < 8; i++) {
        uint32_t v = pool[i % POOL] ^ hash_const;
        hash_const *= MULT_B;
        v *= hash_const;
        v ^= v >> XSHIFT;
        words[i] = v;
    }
    for (i = 0; i < 4; i++)
        out[i] = (uint64_t)words[2 * i] | ((uint64_t)words[2 * i + 1] << 32);
}

/* numpy's PCG64 (XSL-RR 128/64) with its 32-bit buffer for next_uint32. */
typedef struct {
    unsigned __int128 state, inc;
    int has_uint32;
    uint32_t uinteger;
} pcg64;

#define PCG_MULT (((unsigned __int128)2549297995355413924ULL << 64) | 4865540595714422341ULL)

static void pcg_step(pcg64 *g) { g->state = g->state * PCG_MULT + g->inc; }

static void pcg_seed(pcg64 *g, const uint64_t s[4]) {
    unsigned __int128 initstate = ((unsigned __int128)s[0] << 64) | s[1];
    unsigned __int128 initseq = ((unsigned __int128)s[2] << 64) | s[3];
    g->state = 0;
    g->inc = (initseq << 1) | 1;
    pcg_step(g);
    g->state += initstate;
    pcg_step(g);
    g->has_uint32 = 0;
    g->uinteger = 0;
}

static uint64_t next_uint64(pcg64 *g) {
    uint64_t high, low;
    unsigned rot;
    pcg_step(g);
    high = (uint64_t)(g->state >> 64);
    low = (uint64_t)g->state;
    rot = (unsigned)(high >> 58);
    low ^= high;
    return (low >> rot) | (low << ((64 - rot) & 63));
}

static double next_double(pcg64 *g) { return (double)(next_uint64(g) >> 11) * (1.0 / 9007199254740992.0); }

static uint32_t next_uint32(pcg64 *g) {
    uint64_t next;
    if (g->has_uint32) {
        g->has_uint32 = 0;
        return g->uinteger;
    }
    next = next_uint64(g);
    g->has_uint32 = 1;
    g->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)(next & 0xffffffffu);
}

/* Generator.integers(0, high) for 1 <= high <= 2^32: Lemire's bounded draw on 32 bits. */
static int64_t integers(pcg64 *g, int64_t high) {
    uint32_t rng = (uint32_t)(high - 1), rng_excl, leftover;
    uint64_t m;
    if (rng == 0)
        return 0;
    if (rng == 0xffffffffu)
        return next_uint32(g);
    rng_excl = rng + 1;
    m = (uint64_t)next_uint32(g) * rng_excl;
    leftover = (uint32_t)m;
    if (leftover < rng_excl) {
        uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
        while (leftover < threshold) {
            m = (uint64_t)next_uint32(g) * rng_excl;
            leftover = (uint32_t)m;
        }
    }
    return (int64_t)(m >> 32);
}

static double uniform(pcg64 *g, double low, double high) { return low + (high - low) * next_double(g); }

int crop_draw(const crop_draw_request *r, crop_draw_result *out) {
    pcg64 g;
    uint64_t seed[4];
    double area = (double)r->height * (double)r->width;
    double log_lo = log(r->ratio_lo), log_hi = log(r->ratio_hi), in_ratio, lo, hi;
    int attempt;

    if (r->count < 1 || r->count > CROP_DRAW_MAX_KEYS || r->height < 1 || r->width < 1 ||
        r->height > 0xffffffffLL || r->width > 0xffffffffLL)
        return 0;
    seed_state(r->keys, r->count, seed);
    pcg_seed(&g, seed);
    out->found = 0;
    for (attempt = 0; attempt < 10; attempt++) {
        double target = area * uniform(&g, r->scale_lo, r->scale_hi);
        double aspect = exp(uniform(&g, log_lo, log_hi));
        int64_t w = (int64_t)nearbyint(sqrt(target * aspect));
        int64_t h = (int64_t)nearbyint(sqrt(target / aspect));
        if (0 < w && w <= r->width && 0 < h && h <= r->height) {
            out->top = integers(&g, r->height - h + 1);
            out->left = integers(&g, r->width - w + 1);
            out->height = h;
            out->width = w;
            out->found = 1;
            break;
        }
    }
    if (!out->found) {   /* the largest centred crop within the ratio range */
        lo = r->ratio_lo < r->ratio_hi ? r->ratio_lo : r->ratio_hi;
        hi = r->ratio_lo < r->ratio_hi ? r->ratio_hi : r->ratio_lo;
        in_ratio = (double)r->width / (double)r->height;
        if (in_ratio < lo) {
            out->width = r->width;
            out->height = (int64_t)nearbyint((double)r->width / lo);
        } else if (in_ratio > hi) {
            out->height = r->height;
            out->width = (int64_t)nearbyint((double)r->height * hi);
        } else {
            out->height = r->height;
            out->width = r->width;
        }
        out->top = (r->height - out->height) / 2;   /* both non-negative: floor division */
        out->left = (r->width - out->width) / 2;
    }
    out->flip = r->flip ? next_double(&g) < 0.5 : 0;
    return 1;
}
