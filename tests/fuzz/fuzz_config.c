/*
 * fuzz_config.c — libFuzzer target for the config loader.
 *
 * Each input is fed twice: as a whole YAML config file, and (as a C string)
 * as one `--set key.path=value` override. Whatever the bytes, the loader must
 * return errors, never crash, leak or read out of bounds (AddressSanitizer
 * and UBSan watch). Valid configs also go through the cross-key rules and
 * every writer (table, YAML, plan-relevant derived values).
 *
 * Built by `make fuzz` (clang -fsanitize=fuzzer,address,undefined); run for a
 * bounded time by tests/test_fuzz.py over a seed corpus of the shipped configs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *sink;
    static Config defaults;
    if (!sink) {
        sink = fopen("/dev/null", "w");
        config_init_defaults(&defaults);
    }
    Config cfg;
    ConfigErrors err = {0};
    config_copy(&cfg, &defaults);
    config_load_yaml(&cfg, "fuzz.yaml", (const char *)data, size, &err);

    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = 0;
    config_apply_set(&cfg, s, 0, &err);
    free(s);

    if (err.count == 0 && config_validate(&cfg, &err) == 0) {
        config_print_table(&cfg, sink);
        config_write_yaml(&cfg, sink, 1);
        for (int l = 0; l < cfg.model.num_hidden_layers; l++) (void)config_layer_kind(&cfg, l);
    }
    config_errors_free(&err);
    config_free(&cfg);
    return 0;
}
