/*
 * config.c — reading YAML and `--set` overrides into Config, and writing the
 * config back out (resolved table, YAML, Markdown docs, help), all driven by
 * the schema table in config_schema.c.
 *
 * Reading: libyaml's document loader builds a node tree; we walk mappings,
 * join keys into paths ("model.hidden_size"), look each path up in the schema
 * and convert the node by the row's type. Every problem becomes one line in
 * ConfigErrors naming `file:line:col` (of the value, or of the key when the
 * key itself is wrong). Unknown keys get the closest valid key as a
 * suggestion. Defaults go through the same conversion, so a bad default is
 * caught the first time any config is built.
 *
 * YAML rules we hold to (strict on purpose, since a typo in a 1M-token job is
 * expensive): integers and floats and booleans must be plain scalars (a
 * quoted "12" is a string, and an error for an integer key); booleans are
 * true/false only; floats must be finite; strings have no control characters
 * and must fit the row's character set. Anchors and aliases work; a cycle
 * through an alias ends in an unknown-key error, since paths only grow.
 *
 * Callers: cmd/ringscan.c, tests/fuzz/fuzz_config.c; see config.h.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "core/error.h"

#define CONFIG_FILE_MAX (1 << 20) /* refuse config files over 1 MiB */

/* ---- error list --------------------------------------------------------- */

void config_errors_add(ConfigErrors *e, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
    if (e->len + (size_t)n + 2 > e->cap) {
        e->cap = (e->len + (size_t)n + 2) * 2;
        e->text = RS_REALLOC(e->text, e->cap);
    }
    memcpy(e->text + e->len, line, (size_t)n);
    e->len += (size_t)n;
    e->text[e->len++] = '\n';
    e->text[e->len] = 0;
    e->count++;
}

void config_errors_free(ConfigErrors *e) {
    free(e->text);
    memset(e, 0, sizeof *e);
}

/* ---- small helpers ------------------------------------------------------ */

static void *config_field(Config *cfg, int key) { return (char *)cfg + config_schema[key].offset; }
static const void *config_field_const(const Config *cfg, int key) {
    return (const char *)cfg + config_schema[key].offset;
}

/* A value quoted for a message: printable, at most 60 characters. */
static void config_quote(const char *s, size_t len, char *out, size_t n) {
    size_t k = 0;
    if (n < 8) { if (n) out[0] = 0; return; }
    out[k++] = '"';
    for (size_t i = 0; i < len && k + 6 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 60) { out[k++] = '.'; out[k++] = '.'; out[k++] = '.'; break; }
        if (c == '"' || c == '\\') { out[k++] = '\\'; out[k++] = (char)c; }
        else if (c < 0x20 || c == 0x7f) k += (size_t)snprintf(out + k, n - k, "\\x%02x", c);
        else out[k++] = (char)c;
    }
    out[k++] = '"';
    out[k] = 0;
}

static int config_levenshtein(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127) la = 127;
    if (lb > 127) lb = 127;
    int row[128];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cur = row[j];
            int best = prev + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            prev = cur;
        }
    }
    return row[lb];
}

static const char *config_leaf(const char *path) {
    const char *d = strrchr(path, '.');
    return d ? d + 1 : path;
}

/* The closest schema path (or section, for a one-part path), or NULL. */
static const char *config_suggest(const char *path) {
    const char *best = NULL;
    int best_score = 1 << 30;
    bool is_section = strchr(path, '.') == NULL;
    if (is_section) {
        for (int s = 0; config_sections[s]; s++) {
            int d = config_levenshtein(path, config_sections[s]);
            if (d < best_score) { best_score = d; best = config_sections[s]; }
        }
    } else {
        for (int i = 0; i < config_schema_count; i++) {
            const char *cand = config_schema[i].path;
            int d = config_levenshtein(path, cand);
            /* same leaf under another section (model.seq_len -> data.seq_len) */
            if (strcmp(config_leaf(path), config_leaf(cand)) == 0) d = 1;
            if (d < best_score) { best_score = d; best = cand; }
        }
    }
    int limit = (int)strlen(path) / 4;
    if (limit < 2) limit = 2;
    return best_score <= limit ? best : NULL;
}

/* The schema index of the first key under `path` when it is a section like "model", else -1. */
static int config_section_first_key(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < config_schema_count; i++)
        if (strncmp(config_schema[i].path, path, n) == 0 && config_schema[i].path[n] == '.') return i;
    return -1;
}

static bool config_is_section(const char *path) { return config_section_first_key(path) >= 0; }

static void config_list_names(const char *const *names, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; names[i] && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? " | " : "", names[i]);
}

int config_enum_index(const char *const *names, const char *s) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

static const char *config_type_name(ConfigType t) {
    switch (t) {
    case CONFIG_TYPE_INT: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a number";
    case CONFIG_TYPE_BOOL: return "true or false";
    case CONFIG_TYPE_STR: return "a string";
    case CONFIG_TYPE_ENUM: return "one of the names";
    case CONFIG_TYPE_ENUM_LIST: return "a list of names";
    }
    return "?";
}

/* ---- scalar parsing ----------------------------------------------------- */

static bool config_parse_int(const char *s, int64_t *out) {
    if (!*s) return false;
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return false;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return false;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE) return false;
    *out = (int64_t)v;
    return true;
}

static bool config_parse_float(const char *s, double *out) {
    if (!*s) return false;
    for (const char *q = s; *q; q++)  /* digits, sign, '.', exponent only: no "nan", "inf", hex */
        if (!(isdigit((unsigned char)*q) || *q == '+' || *q == '-' || *q == '.' || *q == 'e' || *q == 'E'))
            return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool config_is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static bool config_charset_ok(ConfigCharset cs, const char *s, const char **why) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        if (c < 0x20 || c == 0x7f) { *why = "no control characters"; return false; }
        bool name = isalnum(c) || c == '_' || c == '.' || c == '-';
        switch (cs) {
        case CONFIG_CHARSET_ANY: break;
        case CONFIG_CHARSET_NAME:
            if (!name) { *why = "only letters, digits, '_', '.', '-'"; return false; }
            break;
        case CONFIG_CHARSET_NAMES:
            if (!name && c != ',') { *why = "only letters, digits, '_', '.', '-', ','"; return false; }
            break;
        case CONFIG_CHARSET_PATH:
            if (!name && !strchr("/,+=@:", c)) {
                *why = "only letters, digits and _ . - / , + = @ : (no spaces, quotes or shell characters)";
                return false;
            }
            break;
        case CONFIG_CHARSET_TIME: break;
        }
    }
    if (cs == CONFIG_CHARSET_TIME) {
        /* Slurm forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS */
        /* a field after another is 0..59 (seconds, and minutes after hours), hours after days 0..23;
         * the leading field is unbounded (90 minutes, 48:00:00) */
        int d = 0, h = 0, m = 0, sec = 0;
        char tail;
        bool ok = sscanf(s, "%d-%d:%d:%d%c", &d, &h, &m, &sec, &tail) == 4 ||
                  sscanf(s, "%d-%d:%d%c", &d, &h, &m, &tail) == 3 ||
                  sscanf(s, "%d-%d%c", &d, &h, &tail) == 2 ||
                  sscanf(s, "%d:%d:%d%c", &h, &m, &sec, &tail) == 3 ||
                  (h = 0, sscanf(s, "%d:%d%c", &m, &sec, &tail) == 2) || (sec = 0, sscanf(s, "%d%c", &m, &tail) == 1);
        bool has_h = strchr(s, '-') || strchr(s, ':') != strrchr(s, ':');
        if (ok && (sec > 59 || (has_h && m > 59) || (strchr(s, '-') && h > 23))) {
            *why = "a Slurm time with minutes and seconds 0..59 after the leading field (hours 0..23 after days)";
            return false;
        }
        /* digits, with each ':' and the one '-' between two digits (no signs) */
        for (const char *p = s; ok && *p; p++)
            if (!isdigit((unsigned char)*p) &&
                ((*p != ':' && *p != '-') || p == s || !isdigit((unsigned char)p[-1]) || !isdigit((unsigned char)p[1])))
                ok = false;
        if (strchr(s, '-') != strrchr(s, '-')) ok = false;
        if (!ok || !*s) { *why = "a Slurm time: [D-]HH:MM:SS, HH:MM:SS, MM:SS or MM"; return false; }
    }
    if (strlen(s) >= CONFIG_STR_MAX) { *why = "at most 4095 bytes"; return false; }
    return true;
}

/* ---- converting one node into a field ----------------------------------- */

static const char *config_node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

/* `where` is "file:line:col" or "--set k=v". Returns true when stored. */
static bool config_store_node(Config *cfg, int key, yaml_document_t *doc, yaml_node_t *node,
                              const char *where, ConfigErrors *err) {
    const ConfigKey *k = &config_schema[key];
    void *field = config_field(cfg, key);
    char q[256], names[512];

    if (k->type == CONFIG_TYPE_ENUM_LIST) {
        ConfigEnumList list = {0};
        if (config_is_null_scalar(node)) { *(ConfigEnumList *)field = list; return true; }
        if (node->type != YAML_SEQUENCE_NODE) {
            config_errors_add(err, "%s: %s: expected a list like [%s, ...], got %s", where, k->path,
                              k->names[0], config_node_kind(node));
            return false;
        }
        for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top; it++) {
            yaml_node_t *item = yaml_document_get_node(doc, *it);
            if (!item || item->type != YAML_SCALAR_NODE) {
                config_errors_add(err, "%s: %s: item %d of the list must be a name, got %s", where, k->path,
                                  list.n, item ? config_node_kind(item) : "nothing");
                return false;
            }
            const char *s = (const char *)item->data.scalar.value;
            int v = config_enum_index(k->names, s);
            if (v < 0) {
                config_quote(s, item->data.scalar.length, q, sizeof q);
                config_list_names(k->names, names, sizeof names);
                config_errors_add(err, "%s: %s: item %d is %s; allowed: %s", where, k->path, list.n, q, names);
                return false;
            }
            if (list.n >= CONFIG_LIST_MAX) {
                config_errors_add(err, "%s: %s: more than %d items", where, k->path, CONFIG_LIST_MAX);
                return false;
            }
            list.v[list.n++] = (uint8_t)v;
        }
        *(ConfigEnumList *)field = list;
        return true;
    }

    if (node->type != YAML_SCALAR_NODE) {
        config_errors_add(err, "%s: %s: expected %s, got %s", where, k->path, config_type_name(k->type),
                          config_node_kind(node));
        return false;
    }
    const char *s = (const char *)node->data.scalar.value;
    size_t slen = node->data.scalar.length;
    bool plain = node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    config_quote(s, slen, q, sizeof q);
    if (strlen(s) != slen) { /* an embedded NUL: never a valid value */
        config_errors_add(err, "%s: %s: value contains a NUL byte", where, k->path);
        return false;
    }

    switch (k->type) {
    case CONFIG_TYPE_INT: {
        int64_t v;
        if (k->names && plain && !strcmp(s, "auto")) { /* INTA */
            *(int64_t *)field = CONFIG_AUTO;
            return true;
        }
        if (!plain || !config_parse_int(s, &v)) {
            config_errors_add(err, "%s: %s: expected %s, got %s%s", where, k->path,
                              k->names ? "an integer or auto" : "an integer", q, plain ? "" : " (quoted, so a string)");
            return false;
        }
        if ((double)v < k->min || (double)v > k->max) {
            config_errors_add(err, "%s: %s = %lld is out of range [%.0f, %.0f]", where, k->path, (long long)v,
                              k->min, k->max);
            return false;
        }
        *(int64_t *)field = v;
        return true;
    }
    case CONFIG_TYPE_FLOAT: {
        double v;
        if (!plain || !config_parse_float(s, &v)) {
            config_errors_add(err, "%s: %s: expected a finite number, got %s%s", where, k->path, q,
                              plain ? "" : " (quoted, so a string)");
            return false;
        }
        if (v < k->min || v > k->max) {
            config_errors_add(err, "%s: %s = %g is out of range [%g, %g]", where, k->path, v, k->min, k->max);
            return false;
        }
        *(double *)field = v;
        return true;
    }
    case CONFIG_TYPE_BOOL: {
        bool t = plain && (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"));
        bool f = plain && (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"));
        if (!t && !f) {
            config_errors_add(err, "%s: %s: expected true or false, got %s", where, k->path, q);
            return false;
        }
        *(bool *)field = t;
        return true;
    }
    case CONFIG_TYPE_STR: {
        const char *v = config_is_null_scalar(node) ? "" : s;
        const char *why = NULL;
        if (!config_charset_ok(k->charset, v, &why)) {
            config_errors_add(err, "%s: %s: %s is not allowed here: expected %s", where, k->path, q, why);
            return false;
        }
        char **dst = (char **)field;
        free(*dst);
        *dst = RS_STRDUP(v);
        return true;
    }
    case CONFIG_TYPE_ENUM: {
        int v = config_enum_index(k->names, s);
        if (v < 0) {
            config_list_names(k->names, names, sizeof names);
            config_errors_add(err, "%s: %s: %s is not one of: %s", where, k->path, q, names);
            return false;
        }
        *(int32_t *)field = v;
        return true;
    }
    case CONFIG_TYPE_ENUM_LIST: break; /* handled above */
    }
    return false;
}

/* ---- nesting depth, before libyaml sees the text -------------------------- */

/* libyaml's scanner walks its stack of possible simple keys, one per open flow collection, at every
 * token: text nested n levels deep costs O(n^2) (a 200 KB file of 100k nested '[' took 23 s to be
 * refused). A config is three levels deep, so anything past CONFIG_DEPTH_MAX open '[' or '{' is
 * refused here, in one pass, naming the place. Block nesting needs indentation: 1 MiB of it holds
 * about 1400 levels, which libyaml reads in milliseconds. Quoted scalars and comments are skipped
 * the way YAML reads them (a quote opens a scalar only where a token starts; '#' after a space or
 * at a line's start opens a comment). Returns false, with an error added, when too deep. */
#define CONFIG_DEPTH_MAX 64

static bool config_check_depth(const char *name, const char *text, size_t len, ConfigErrors *err) {
    int depth = 0, line = 1, col = 1;
    char quote = 0;
    bool comment = false;
    for (size_t i = 0; i < len; i++, col++) {
        char c = text[i], prev = i ? text[i - 1] : '\n';
        if (c == '\n') {
            line++;
            col = 0;
            comment = false;
            continue;
        }
        if (comment) continue;
        if (quote) {
            if (quote == '"' && c == '\\') { i++; col++; } /* an escape: skip the next character */
            else if (c == quote) quote = 0;                /* '' inside '...' reopens at once: same result */
            continue;
        }
        bool token_start = prev == ' ' || prev == '\t' || prev == '\n' || prev == '[' || prev == '{' || prev == ',';
        if ((c == '\'' || c == '"') && token_start) quote = c;
        else if (c == '#' && (prev == ' ' || prev == '\t' || prev == '\n')) comment = true;
        else if (c == '[' || c == '{') {
            if (++depth > CONFIG_DEPTH_MAX) {
                config_errors_add(err, "%s:%d:%d: more than %d nested '[' or '{': a config nests sections, keys "
                                       "and one list (3 levels)",
                                  name, line, col, CONFIG_DEPTH_MAX);
                return false;
            }
        } else if ((c == ']' || c == '}') && depth > 0) depth--;
    }
    return true;
}

/* Parses `text` as one YAML document and stores its root into `key`. */
static bool config_store_text(Config *cfg, int key, const char *text, const char *where, ConfigErrors *err) {
    yaml_parser_t parser;
    yaml_document_t doc;
    bool ok = false;
    if (!config_check_depth(where, text, strlen(text), err)) return false;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    if (!yaml_parser_load(&parser, &doc)) {
        config_errors_add(err, "%s: %s: not a YAML value: %s", where, config_schema[key].path,
                          parser.problem ? parser.problem : "parse error");
        yaml_parser_delete(&parser);
        return false;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t empty = {0};
    if (!root) { /* empty text: a null plain scalar */
        empty.type = YAML_SCALAR_NODE;
        empty.data.scalar.value = (yaml_char_t *)"";
        empty.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
        root = &empty;
    }
    ok = config_store_node(cfg, key, &doc, root, where, err);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return ok;
}

/* ---- defaults ----------------------------------------------------------- */

void config_init_defaults(Config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    ConfigErrors err = {0};
    for (int i = 0; i < config_schema_count; i++) {
        char where[160];
        snprintf(where, sizeof where, "default of %s", config_schema[i].path);
        if (!config_store_text(cfg, i, config_schema[i].def, where, &err))
            RS_FATAL("bad default in config_schema.c: %s", err.text ? err.text : "?");
        cfg->source[i].origin = CONFIG_ORIGIN_DEFAULT;
    }
}

void config_free(Config *cfg) {
    for (int i = 0; i < config_schema_count; i++)
        if (config_schema[i].type == CONFIG_TYPE_STR) {
            char **p = (char **)config_field(cfg, i);
            free(*p);
            *p = NULL;
        }
    free(cfg->file);
    cfg->file = NULL;
}

void config_copy(Config *dst, const Config *src) {
    *dst = *src;
    for (int i = 0; i < config_schema_count; i++)
        if (config_schema[i].type == CONFIG_TYPE_STR) {
            char **p = (char **)config_field(dst, i);
            if (*p) *p = RS_STRDUP(*p);
        }
    if (src->file) dst->file = RS_STRDUP(src->file);
}

/* ---- walking a YAML file ------------------------------------------------ */

typedef struct {
    Config          *cfg;
    yaml_document_t *doc;
    const char      *name;
    ConfigErrors    *err;
} ConfigWalk;

static void config_walk_mapping(ConfigWalk *w, yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, pr->value);
        if (!kn || !vn) continue;
        int kl = (int)kn->start_mark.line + 1, kc = (int)kn->start_mark.column + 1;
        if (kn->type != YAML_SCALAR_NODE) {
            config_errors_add(w->err, "%s:%d:%d: keys must be plain names, got %s as a key%s%s", w->name, kl, kc,
                              config_node_kind(kn), prefix ? " under " : "", prefix ? prefix : "");
            continue;
        }
        const char *kname = (const char *)kn->data.scalar.value;
        char path[512], q[256];
        int pn = snprintf(path, sizeof path, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", kname);
        if (pn < 0 || (size_t)pn >= sizeof path || strlen(kname) != kn->data.scalar.length) {
            config_quote(kname, kn->data.scalar.length, q, sizeof q);
            config_errors_add(w->err, "%s:%d:%d: unknown key %s", w->name, kl, kc, q);
            continue;
        }
        int key = config_find_key(path);
        if (key >= 0) {
            ConfigSource *src = &w->cfg->source[key];
            if (src->origin == CONFIG_ORIGIN_FILE) {
                config_errors_add(w->err, "%s:%d:%d: %s is given twice (first at line %d)", w->name, kl, kc, path,
                                  src->line);
                continue;
            }
            char where[600];
            snprintf(where, sizeof where, "%s:%d:%d", w->name, (int)vn->start_mark.line + 1,
                     (int)vn->start_mark.column + 1);
            if (config_store_node(w->cfg, key, w->doc, vn, where, w->err)) {
                src->origin = CONFIG_ORIGIN_FILE;
                src->line = kl;
                src->col = kc;
            }
        } else if (config_is_section(path)) {
            if (vn->type == YAML_MAPPING_NODE)
                config_walk_mapping(w, vn, path);
            else if (!config_is_null_scalar(vn)) /* "model:" with nothing under it is fine */
                config_errors_add(w->err, "%s:%d:%d: %s is a section: expected a mapping of keys under it, got %s",
                                  w->name, kl, kc, path, config_node_kind(vn));
        } else {
            const char *hint = config_suggest(path);
            config_quote(path, strlen(path), q, sizeof q);
            if (hint)
                config_errors_add(w->err, "%s:%d:%d: unknown key %s; did you mean '%s'?", w->name, kl, kc, q, hint);
            else
                config_errors_add(w->err, "%s:%d:%d: unknown key %s (`ringscan config dump` lists every key)",
                                  w->name, kl, kc, q);
        }
    }
}

int config_load_yaml(Config *cfg, const char *name, const char *text, size_t len, ConfigErrors *err) {
    int before = err->count;
    yaml_parser_t parser;
    yaml_document_t doc;
    free(cfg->file);
    cfg->file = RS_STRDUP(name);
    if (!config_check_depth(name, text, len, err)) return err->count - before;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_mark_t m = parser.problem_mark;
        config_errors_add(err, "%s:%d:%d: YAML syntax error: %s%s%s", name, (int)m.line + 1, (int)m.column + 1,
                          parser.problem ? parser.problem : "parse error", parser.context ? " " : "",
                          parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return err->count - before;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && root->type != YAML_MAPPING_NODE && !config_is_null_scalar(root)) {
        config_errors_add(err, "%s:%d:%d: the top level must be a mapping of sections (run:, model:, data:, ...), "
                               "got %s",
                          name, (int)root->start_mark.line + 1, (int)root->start_mark.column + 1,
                          config_node_kind(root));
    } else if (root && root->type == YAML_MAPPING_NODE) {
        ConfigWalk w = {cfg, &doc, name, err};
        config_walk_mapping(&w, root, NULL);
    }
    yaml_document_delete(&doc);
    /* a second document is almost always a stray '---' and a mistake */
    if (root) {
        if (!yaml_parser_load(&parser, &doc)) {
            yaml_mark_t m = parser.problem_mark;
            config_errors_add(err, "%s:%d:%d: YAML syntax error: %s", name, (int)m.line + 1, (int)m.column + 1,
                              parser.problem ? parser.problem : "parse error");
        } else {
            yaml_node_t *second = yaml_document_get_root_node(&doc);
            if (second)
                config_errors_add(err, "%s:%d:%d: a second YAML document; a config is one document", name,
                                  (int)second->start_mark.line + 1, (int)second->start_mark.column + 1);
            yaml_document_delete(&doc);
        }
    }
    yaml_parser_delete(&parser);
    return err->count - before;
}

int config_load_file(Config *cfg, const char *path, ConfigErrors *err) {
    /* a regular file only, checked before opening: open() of a FIFO would wait for a writer forever
     * (O_NONBLOCK covers a path that turns into one between the two) */
    struct stat st;
    int fd = -1;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        config_errors_add(err, "%s: the config file is not a regular file (it is %s)", path,
                          S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory" : "a device or socket");
        return 1;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *f = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "rb") : NULL;
    if (!f) {
        config_errors_add(err, "%s: cannot open the config file: %s", path,
                          fd >= 0 ? "not a regular file" : strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    char *buf = RS_MALLOC(CONFIG_FILE_MAX + 1);
    size_t n = fread(buf, 1, CONFIG_FILE_MAX + 1, f);
    bool bad = ferror(f);
    fclose(f);
    int count;
    if (bad) {
        config_errors_add(err, "%s: cannot read the config file", path);
        count = 1;
    } else if (n > CONFIG_FILE_MAX) {
        config_errors_add(err, "%s: the config file is larger than 1 MiB", path);
        count = 1;
    } else {
        buf[n] = 0;
        count = config_load_yaml(cfg, path, buf, n, err);
    }
    free(buf);
    return count;
}

int config_apply_set(Config *cfg, const char *assignment, int index, ConfigErrors *err) {
    const char *eq = strchr(assignment, '=');
    char q[256];
    config_quote(assignment, strlen(assignment), q, sizeof q);
    if (!eq || eq == assignment) {
        config_errors_add(err, "--set %s: expected key.path=value", q);
        return 1;
    }
    char path[256];
    size_t kn = (size_t)(eq - assignment);
    if (kn >= sizeof path) {
        config_errors_add(err, "--set %s: key too long", q);
        return 1;
    }
    memcpy(path, assignment, kn);
    path[kn] = 0;
    int key = config_find_key(path);
    if (key < 0 && config_is_section(path)) {
        config_errors_add(err, "--set %s: '%s' is a section, not a key: give a key under it, like %s.%s", q, path,
                          path, config_leaf(config_schema[config_section_first_key(path)].path));
        return 1;
    }
    if (key < 0) {
        const char *hint = config_suggest(path);
        if (hint)
            config_errors_add(err, "--set %s: unknown key '%s'; did you mean '%s'?", q, path, hint);
        else
            config_errors_add(err, "--set %s: unknown key '%s' (`ringscan config dump` lists every key)", q, path);
        return 1;
    }
    char where[300];
    snprintf(where, sizeof where, "--set %s", q);
    if (!config_store_text(cfg, key, eq + 1, where, err)) return 1;
    cfg->source[key].origin = CONFIG_ORIGIN_SET;
    cfg->source[key].set_index = index;
    return 0;
}

/* ---- writing values ----------------------------------------------------- */

static void config_format_double(double v, char *buf, size_t n) {
    for (int p = 1; p <= 17; p++) { /* shortest text that reads back to the same double */
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", n - strlen(buf) - 1); /* keep it a float in YAML */
}

/* The length of the UTF-8 sequence at p (1..4), or 0 when it is not valid UTF-8. */
static int config_utf8_len(const unsigned char *p) {
    int n = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || (n == 2 && p[0] < 0xc2) || (n == 4 && p[0] > 0xf4)) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) return 0; /* overlong, surrogate */
    if (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))) return 0;
    return n;
}

int config_yaml_quote(char *out, size_t cap, const char *s) {
    size_t j = 0;
    if (cap < 3) {
        if (cap) out[0] = 0;
        return -1;
    }
    out[j++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        char esc[8] = "";
        int n = config_utf8_len(p);
        if (!n) {
            out[0] = 0;
            return -1;
        }
        if (*p == '"' || *p == '\\') snprintf(esc, sizeof esc, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", *p);
        else if (n == 2 && p[0] == 0xc2 && p[1] == 0x85) snprintf(esc, sizeof esc, "\\N");
        else if (n == 3 && p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
            snprintf(esc, sizeof esc, "\\%c", p[2] == 0xa8 ? 'L' : 'P');
        size_t k = esc[0] ? strlen(esc) : (size_t)n;
        if (j + k + 2 > cap) {
            out[0] = 0;
            return -1;
        }
        memcpy(out + j, esc[0] ? esc : (const char *)p, k);
        j += k;
        p += n;
    }
    out[j++] = '"';
    out[j] = 0;
    return 0;
}

void config_format_value(const Config *cfg, int key, char *buf, size_t n) {
    const ConfigKey *k = &config_schema[key];
    const void *f = config_field_const(cfg, key);
    switch (k->type) {
    case CONFIG_TYPE_INT:
        if (k->names && *(const int64_t *)f == CONFIG_AUTO) snprintf(buf, n, "auto");
        else snprintf(buf, n, "%lld", (long long)*(const int64_t *)f);
        break;
    case CONFIG_TYPE_FLOAT: config_format_double(*(const double *)f, buf, n); break;
    case CONFIG_TYPE_BOOL: snprintf(buf, n, "%s", *(const bool *)f ? "true" : "false"); break;
    case CONFIG_TYPE_ENUM: snprintf(buf, n, "%s", k->names[*(const int32_t *)f]); break;
    case CONFIG_TYPE_STR: {
        const char *s = *(char *const *)f;
        /* a stored value came through libyaml (UTF-8, < CONFIG_STR_MAX bytes): it fits CONFIG_VALUE_MAX; a
         * smaller buffer (a message, the table) gets the start of it, marked "..." */
        if (config_yaml_quote(buf, n, s ? s : "") == 0) break;
        size_t big = 4 * strlen(s) + 8;
        char *all = RS_MALLOC(big);
        if (config_yaml_quote(all, big, s) != 0) RS_FATAL("%s: the stored value is not UTF-8", k->path);
        if (n > 5) snprintf(buf, n, "%.*s...\"", (int)(n - 5), all);
        else if (n) buf[0] = 0;
        free(all);
        break;
    }
    case CONFIG_TYPE_ENUM_LIST: {
        const ConfigEnumList *l = f;
        size_t j = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < l->n && j < n; i++)
            j += (size_t)snprintf(buf + j, n - j, "%s%s", i ? ", " : "", k->names[l->v[i]]);
        if (j < n) snprintf(buf + j, n - j, "]");
        break;
    }
    }
}

void config_format_source(const Config *cfg, int key, char *buf, size_t n) {
    const ConfigSource *s = &cfg->source[key];
    switch (s->origin) {
    case CONFIG_ORIGIN_FILE: snprintf(buf, n, "%s:%d:%d", cfg->file ? cfg->file : "?", s->line, s->col); break;
    case CONFIG_ORIGIN_SET: snprintf(buf, n, "--set #%d", s->set_index + 1); break;
    default: snprintf(buf, n, "default"); break;
    }
}

static void config_describe_type(const ConfigKey *k, char *buf, size_t n) {
    char names[512];
    switch (k->type) {
    case CONFIG_TYPE_INT:
        if (k->max >= 9.0e18) snprintf(buf, n, "%sint >= %.0f", k->names ? "auto | " : "", k->min);
        else snprintf(buf, n, "%sint %.0f..%.0f", k->names ? "auto | " : "", k->min, k->max);
        break;
    case CONFIG_TYPE_FLOAT: snprintf(buf, n, "float %g..%g", k->min, k->max); break;
    case CONFIG_TYPE_BOOL: snprintf(buf, n, "bool"); break;
    case CONFIG_TYPE_STR: {
        static const char *cs[] = {"string", "name [A-Za-z0-9_.-]", "names [A-Za-z0-9_.-,]",
                                   "path [A-Za-z0-9_.,/+=@:-]", "time [D-]HH:MM:SS"};
        snprintf(buf, n, "%s", cs[k->charset]);
        break;
    }
    case CONFIG_TYPE_ENUM:
        config_list_names(k->names, names, sizeof names);
        snprintf(buf, n, "%s", names);
        break;
    case CONFIG_TYPE_ENUM_LIST:
        config_list_names(k->names, names, sizeof names);
        snprintf(buf, n, "list of %s", names);
        break;
    }
}

void config_print_table(const Config *cfg, FILE *f) {
    enum { VALW = 40 };
    int kw = 3, sw = 4;
    char v[CONFIG_VALUE_MAX], s[600];
    for (int i = 0; i < config_schema_count; i++) {
        int l = (int)strlen(config_schema[i].path);
        if (l > kw) kw = l;
        config_format_source(cfg, i, s, sizeof s);
        if ((int)strlen(s) > sw) sw = (int)strlen(s);
    }
    char rule[512];
    int rn = snprintf(rule, sizeof rule, "+-%.*s-+-%.*s-+-%.*s-+", kw,
                      "----------------------------------------------------------------", VALW,
                      "----------------------------------------------------------------", sw,
                      "----------------------------------------------------------------------------------");
    (void)rn;
    fprintf(f, "%s\n| %-*s | %-*s | %-*s |\n%s\n", rule, kw, "key", VALW, "value", sw, "from", rule);
    for (int i = 0; i < config_schema_count; i++) {
        config_format_value(cfg, i, v, sizeof v);
        if (strlen(v) > VALW) strcpy(v + VALW - 3, "...");
        config_format_source(cfg, i, s, sizeof s);
        fprintf(f, "| %-*s | %-*s | %-*s |\n", kw, config_schema[i].path, VALW, v, sw, s);
    }
    fprintf(f, "%s\n", rule);
}

void config_write_yaml(const Config *cfg, FILE *f, bool docs) {
    char v[CONFIG_VALUE_MAX], t[600];
    for (int s = 0; config_sections[s]; s++) {
        size_t sl = strlen(config_sections[s]);
        if (docs) fprintf(f, "%s# %s\n", s ? "\n" : "", config_section_docs[s]);
        fprintf(f, "%s:\n", config_sections[s]);
        for (int i = 0; i < config_schema_count; i++) {
            const ConfigKey *k = &config_schema[i];
            if (strncmp(k->path, config_sections[s], sl) != 0 || k->path[sl] != '.') continue;
            config_format_value(cfg, i, v, sizeof v);
            if (docs) {
                config_describe_type(k, t, sizeof t);
                fprintf(f, "  # %s  [%s%s%s; module %s]\n", k->doc, t, *k->unit ? ", " : "", k->unit, k->module);
            }
            fprintf(f, "  %s: %s\n", k->path + sl + 1, v);
        }
    }
}

void config_write_markdown(FILE *f) {
    Config def;
    config_init_defaults(&def);
    char v[CONFIG_VALUE_MAX], t[600];
    fprintf(f, "# ringscan configuration keys\n\n"
               "Generated by `ringscan config docs` from the schema table in `lib/config/config_schema.c`;\n"
               "do not edit by hand. `ringscan config dump` prints the same keys as a loadable YAML file.\n"
               "Any key can be overridden on the command line with `--set key.path=value`.\n");
    for (int s = 0; config_sections[s]; s++) {
        size_t sl = strlen(config_sections[s]);
        fprintf(f, "\n## `%s`: %s\n\n| key | type | default | unit | module | meaning |\n|---|---|---|---|---|---|\n",
                config_sections[s], config_section_docs[s]);
        for (int i = 0; i < config_schema_count; i++) {
            const ConfigKey *k = &config_schema[i];
            if (strncmp(k->path, config_sections[s], sl) != 0 || k->path[sl] != '.') continue;
            config_format_value(&def, i, v, sizeof v);
            config_describe_type(k, t, sizeof t);
            for (char *p = t; *p; p++) if (*p == '|') *p = '/';
            fprintf(f, "| `%s` | %s | `%s` | %s | %s | %s |\n", k->path, t, v, k->unit, k->module, k->doc);
        }
    }
    config_free(&def);
}

void config_print_help(FILE *f) {
    Config def;
    config_init_defaults(&def);
    char v[CONFIG_VALUE_MAX], t[600];
    fprintf(f, "Config keys (YAML sections, or --set key.path=value):\n");
    for (int i = 0; i < config_schema_count; i++) {
        const ConfigKey *k = &config_schema[i];
        config_format_value(&def, i, v, sizeof v);
        config_describe_type(k, t, sizeof t);
        fprintf(f, "  %-32s %s (default %s)\n  %-32s   %s\n", k->path, t, v, "", k->doc);
    }
    config_free(&def);
}

int config_diff(const Config *a, const Config *b, const char *const *prefixes, char *out, size_t n) {
    int count = 0;
    size_t k = out && n ? strlen(out) : 0;
    char va[CONFIG_VALUE_MAX], vb[CONFIG_VALUE_MAX];
    for (int i = 0; i < config_schema_count; i++) {
        int match = 0;
        for (int j = 0; prefixes[j]; j++)
            if (!strncmp(config_schema[i].path, prefixes[j], strlen(prefixes[j]))) match = 1;
        if (!match) continue;
        config_format_value(a, i, va, sizeof va);
        config_format_value(b, i, vb, sizeof vb);
        if (strcmp(va, vb) == 0) continue;
        count++;
        if (out && k < n) {
            int w = snprintf(out + k, n - k, "  %s: %.60s -> %.60s\n", config_schema[i].path, va, vb);
            if (w > 0) k += (size_t)w;
        }
    }
    return count;
}

/* ---- derived facts ------------------------------------------------------ */

LayerKind config_layer_kind(const Config *cfg, int layer) {
    const ModelConfig *m = &cfg->model;
    if (m->layer_types.n > 0) return (LayerKind)m->layer_types.v[layer];
    return ((layer + 1) % m->full_attention_interval == 0) ? LAYER_KIND_FULL : LAYER_KIND_LINEAR;
}

int64_t config_rotary_dim(const Config *cfg) {
    return (int64_t)((double)cfg->model.head_dim * cfg->model.partial_rotary_factor);
}

int64_t config_world(const Config *cfg) { return cfg->parallel.dp * cfg->parallel.cp; }

int64_t config_tasks_per_node(const Config *cfg) {
    if (cfg->slurm.gpus_per_node > 0) return cfg->slurm.gpus_per_node;
    return config_world(cfg) / cfg->slurm.nodes; /* config_validate checked that it divides */
}
