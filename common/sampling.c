/* sampling.c - a request's sampling parameters: defaults and checks. */
#include "common/sampling.h"

#include <math.h>

#include "common/log.h"

void fy_sampling_params_default(fy_sampling_params_t *p)
{
    *p = (fy_sampling_params_t){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0};
}

fy_status_t fy_sampling_params_check(const fy_sampling_params_t *p)
{
    if (!isfinite(p->temperature) || p->temperature < 0.0f || p->temperature > 100.0f) {
        fy_error("sampling: temperature %g out of range [0, 100]", (double)p->temperature);
        return FY_ERR_INVALID;
    }
    if (p->top_k < 0) {
        fy_error("sampling: top_k %d is negative", p->top_k);
        return FY_ERR_INVALID;
    }
    if (!isfinite(p->top_p) || p->top_p <= 0.0f || p->top_p > 1.0f) {
        fy_error("sampling: top_p %g out of range (0, 1]", (double)p->top_p);
        return FY_ERR_INVALID;
    }
    if (!isfinite(p->min_p) || p->min_p < 0.0f || p->min_p > 1.0f) {
        fy_error("sampling: min_p %g out of range [0, 1]", (double)p->min_p);
        return FY_ERR_INVALID;
    }
    return FY_OK;
}

bool fy_sampling_is_greedy(const fy_sampling_params_t *p)
{
    return !(p->temperature >= FY_SAMPLING_MIN_TEMP) || p->top_k == 1;
}
