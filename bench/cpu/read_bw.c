// DRAM read bandwidth of this machine, for the CPU benchmark's roofline: AVX2 loads over a
// 256 MiB buffer (far past the last-level cache), 1 and 2 OpenMP threads, best of 5 passes.
//
//   gcc -O2 -mavx2 -fopenmp bench/cpu/read_bw.c -o /tmp/read_bw && /tmp/read_bw
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    size_t n = (size_t)1 << 28;
    char *p = aligned_alloc(64, n);
    for (size_t i = 0; i < n; i++) p[i] = (char)i;
    for (int th = 1; th <= 2; th++) {
        double best = 0;
        for (int rep = 0; rep < 5; rep++) {
            double t = omp_get_wtime();
            __m256i acc = _mm256_setzero_si256();
#pragma omp parallel num_threads(th)
            {
                __m256i a = _mm256_setzero_si256();
#pragma omp for
                for (size_t i = 0; i < n; i += 128) {
                    a = _mm256_add_epi8(a, _mm256_load_si256((__m256i *)(p + i)));
                    a = _mm256_add_epi8(a, _mm256_load_si256((__m256i *)(p + i + 32)));
                    a = _mm256_add_epi8(a, _mm256_load_si256((__m256i *)(p + i + 64)));
                    a = _mm256_add_epi8(a, _mm256_load_si256((__m256i *)(p + i + 96)));
                }
#pragma omp critical
                acc = _mm256_add_epi8(acc, a);
            }
            t = omp_get_wtime() - t;
            double bw = n / t / 1e9;
            if (bw > best) best = bw;
            if (_mm256_extract_epi8(acc, 3) == 77) printf(" ");  // keep the sum live
        }
        printf("%d threads: %.1f GB/s\n", th, best);
    }
    free(p);
    return 0;
}
