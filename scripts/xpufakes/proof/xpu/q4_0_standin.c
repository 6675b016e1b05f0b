/* A CPU stand-in for intel/llm-scaler's vllm_int4_for_multi_arc.so (the
 * library its sym_int4 quantization loads with ctypes from
 * VLLM_QUANTIZE_Q40_LIB, on the CPU, while it processes the weights after
 * loading). One function, with the signature sym_int4.py declares
 * (argtypes, restype) and the layout the image's tests read back
 * (custom-esimd-kernels-vllm/tests/test_norm_gemv_int4.py, cpu_dequantize):
 *   qweight[n][k / 8]: 8 unsigned 4-bit values, value k % 8 in bits
 *                      4 * (k % 8)..; the weight is (q - 8) * scale
 *   scale[n][k / block_size]: float16 bits
 * Quantized as ggml's Q4_0: per block, d = (the value of largest magnitude)
 * / -8, q = clamp(round(x / d) + 8, 0, 15). Returns the bytes written. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint16_t to_half(float value) {
    _Float16 half = (_Float16)value;
    uint16_t bits;
    memcpy(&bits, &half, sizeof bits);
    return bits;
}

size_t quantize_q4_0_to_qweight_and_scale(const float *src, int32_t *qweight,
                                          uint16_t *scale, int out_features,
                                          int in_features, int block_size) {
    int blocks = in_features / block_size;
    for (int n = 0; n < out_features; ++n) {
        const float *row = src + (size_t)n * in_features;
        for (int b = 0; b < blocks; ++b) {
            const float *block = row + (size_t)b * block_size;
            float largest = 0.0f;
            for (int i = 0; i < block_size; ++i) {
                if (fabsf(block[i]) > fabsf(largest)) largest = block[i];
            }
            float d = largest / -8.0f;
            float inverse = d != 0.0f ? 1.0f / d : 0.0f;
            scale[(size_t)n * blocks + b] = to_half(d);
            for (int i = 0; i < block_size; i += 8) {
                uint32_t packed = 0;
                for (int j = 0; j < 8; ++j) {
                    int q = (int)lroundf(block[i + j] * inverse) + 8;
                    q = q < 0 ? 0 : (q > 15 ? 15 : q);
                    packed |= (uint32_t)q << (4 * j);
                }
                qweight[((size_t)n * in_features + (size_t)b * block_size + i) / 8] =
                    (int32_t)packed;
            }
        }
    }
    return (size_t)out_features * (in_features / 8) * sizeof(int32_t) +
           (size_t)out_features * blocks * sizeof(uint16_t);
}
