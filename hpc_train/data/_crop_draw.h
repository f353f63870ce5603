/* RandomResizedCrop's box and the horizontal flip of one sample, drawn exactly as
 * hpc_train.data.transforms draws them with numpy: np.random.default_rng([seed, epoch, index])
 * (SeedSequence, PCG64), then rrc_params (torchvision's 10 attempts, uniform scale and
 * log-uniform ratio, Generator.integers for the corner, the centred fallback) and, when asked,
 * Generator.random() < 0.5 for the flip. The same numbers, so a node with the extension and one
 * without crop every sample alike (tests/data/test_crop_draw.py compares them on many keys).
 * Why in C: creating a Generator and its five or six draws cost about 70 us of a ~1 ms sample in
 * the decode workers, where the interpreter runs with caches the JPEG decode just filled. */
#ifndef HPC_TRAIN_CROP_DRAW_H
#define HPC_TRAIN_CROP_DRAW_H

#include <stdint.h>

#define CROP_DRAW_MAX_KEYS 4

typedef struct {
    uint64_t keys[CROP_DRAW_MAX_KEYS];   /* the SeedSequence entropy: (seed, epoch, index) */
    int count;
    int64_t height, width;               /* the image's, 1 to 2^32 - 1 */
    double scale_lo, scale_hi, ratio_lo, ratio_hi;
    int flip;                            /* draw the flip (else it is 0) */
} crop_draw_request;

typedef struct {
    int64_t top, left, height, width;
    int flip, found;                     /* found: an attempt fitted (else the centred fallback) */
} crop_draw_result;

/* 1 and *out filled, or 0 for a request outside the ranges above. */
int crop_draw(const crop_draw_request *r, crop_draw_result *out);

#endif
