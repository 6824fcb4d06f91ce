/*
 * data_format.h — the format readers of a token file, which data_source_open
 * (data_source.c) dispatches to: each opens the file(s) of its format,
 * validates them and fills the DataSource (tokens, dtype, documents, byte
 * offsets), reading through data_file.c. data_flat.c: ringscan's flat file;
 * data_megatron.c: a Megatron .bin/.idx pair (data.h has both formats).
 *
 * Callers: data_source.c.
 */
#ifndef RS_DATA_FORMAT_H
#define RS_DATA_FORMAT_H

#include <stddef.h>

#include "data.h"

int data_flat_open(DataSource *src, const char *path, char *err, size_t n);
int data_megatron_open(DataSource *src, const char *prefix, char *err, size_t n);

#endif
