/*
 * safetensors.h — reading and writing tensor files in the safetensors format
 * (github.com/huggingface/safetensors), so checkpoints and exports open in
 * common tools.
 *
 * The format:
 *   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
 *   bytes [8, 8+N)      the header: a UTF-8 JSON object, starting with '{'
 *                       (and padded with spaces), mapping each tensor name to
 *                       {"dtype": "F32", "shape": [2, 3], "data_offsets": [B, E]},
 *                       plus an optional "__metadata__": {string: string}
 *   bytes [8+N, end)    the data buffer; tensor t occupies [8+N+B, 8+N+E),
 *                       row-major, little-endian
 * Rules the reader enforces (those of the reference implementation): N at
 * most 100,000,000 and within the file; JSON well formed with no duplicate
 * keys; every entry has exactly dtype, shape and data_offsets; shape entries
 * are non-negative integers (shape [] is a scalar, a 0 anywhere an empty
 * tensor); E - B equals (product of shape) x (dtype size); the tensors cover
 * the data buffer exactly — no overlap, no gap, no trailing bytes.
 *
 * The writer pads the header with spaces so the data starts 8-byte aligned,
 * orders tensors by element size (largest first, otherwise as given) so each
 * one is aligned to its own element size, and writes durably (temporary file,
 * fsync, rename, fsync of the directory; see fsio.h).
 *
 * The reader reads with pread into caller buffers (no mmap, so a file that
 * shrinks while open is an error, not a SIGBUS) and checks the dtype and
 * shape the caller expects. A corrupt file is never trusted: every failure
 * returns one line naming the file and what was expected vs found.
 *
 * Return values everywhere: 0, RS_EXIT_USAGE (bad or corrupt input, bad
 * arguments) or RS_EXIT_FAIL (an I/O failure), with the message in `err`.
 *
 * Callers: lib/io/ckpt.c (checkpoint tensor files), the exporter,
 * tests/tools/ckpt_stress.c (dump and sample modes), tests/unit/test_ckpt.c.
 */
#ifndef RS_SAFETENSORS_H
#define RS_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((int64_t)100000000) /* the reference implementation's limit */
#define ST_METADATA_KEY "__metadata__"

typedef enum {
    ST_DTYPE_BOOL,
    ST_DTYPE_U8,
    ST_DTYPE_I8,
    ST_DTYPE_F8_E5M2,
    ST_DTYPE_F8_E4M3,
    ST_DTYPE_I16,
    ST_DTYPE_U16,
    ST_DTYPE_F16,
    ST_DTYPE_BF16,
    ST_DTYPE_I32,
    ST_DTYPE_U32,
    ST_DTYPE_F32,
    ST_DTYPE_F64,
    ST_DTYPE_I64,
    ST_DTYPE_U64,
    ST_DTYPE_COUNT
} StDtype;

/* The names as they appear in the header ("F32", "BF16", ...), index = value. */
extern const char *const st_dtype_names[ST_DTYPE_COUNT + 1];
int64_t st_dtype_size(StDtype dtype);
/* Returns 0 and sets *out, or -1 for an unknown name. */
int st_dtype_parse(const char *name, StDtype *out);

/* One tensor to write (data points at numel x size bytes; may be NULL when
 * that is 0), or one tensor found in a file (offset/nbytes filled, data NULL). */
typedef struct {
    const char *name;
    StDtype dtype;
    int32_t ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    int64_t offset; /* reader: absolute byte offset of the data in the file */
    int64_t nbytes; /* reader: size of the data in bytes */
} StTensor;

/* Number of elements (1 for a scalar); -1 when a dimension is negative or the
 * product overflows int64. */
int64_t st_numel(int32_t ndim, const int64_t *shape);
/* "[2, 3]" into buf (for messages). */
void st_format_shape(char *buf, size_t cap, int32_t ndim, const int64_t *shape);

/* What the writer produced: the file size and the zlib crc32 of all its bytes. */
typedef struct {
    int64_t size;
    uint32_t crc32;
} StWriteInfo;

/* Writes n tensors to `path` durably. `metadata` may be NULL or a JSON object
 * whose values are all strings. Names must be non-empty, unique and not
 * "__metadata__". info may be NULL. */
int safetensors_write_file(const char *path, const StTensor *tensors, int64_t n, const json_t *metadata,
                           StWriteInfo *info, char *err, size_t err_len);

/* An open, validated file. */
typedef struct {
    char *path;
    int fd;
    int64_t file_size;
    int64_t data_start; /* 8 + header length */
    int64_t n;
    StTensor *tensors; /* in header order; names owned */
    json_t *metadata;  /* the "__metadata__" object, or NULL */
} SafetensorsFile;

/* Opens and validates the whole header against the file's size. On failure
 * `f` holds nothing to close. */
int safetensors_open(SafetensorsFile *f, const char *path, char *err, size_t err_len);
void safetensors_close(SafetensorsFile *f);

/* The entry named `name`, or NULL. */
const StTensor *safetensors_find(const SafetensorsFile *f, const char *name);

/* Reads tensor `name` into dst, which must hold numel(shape) x size(dtype)
 * bytes. The tensor must exist and have exactly this dtype and shape;
 * otherwise an error naming the tensor, the file, and both dtypes/shapes. */
int safetensors_read(const SafetensorsFile *f, const char *name, StDtype dtype, int32_t ndim, const int64_t *shape,
                     void *dst, char *err, size_t err_len);

#endif
