// toolcall.c: tools in Qwen3.6's format (see toolcall.h).
#include "toolcall.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- tojson: Python's json.dumps(x, ensure_ascii=False) ----------------------------------------

static void tput(struct sbuf *b, const char *s, size_t n) {
    sbuf_add(b, s, n);
} // failures: b->oom

static void tputs(struct sbuf *b, const char *s) {
    sbuf_adds(b, s);
}

static void dump_string(struct sbuf *b, const char *s, size_t n) {
    tputs(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        switch (c) {
        case '"':
            tputs(b, "\\\"");
            break;
        case '\\':
            tputs(b, "\\\\");
            break;
        case '\n':
            tputs(b, "\\n");
            break;
        case '\r':
            tputs(b, "\\r");
            break;
        case '\t':
            tputs(b, "\\t");
            break;
        case '\b':
            tputs(b, "\\b");
            break;
        case '\f':
            tputs(b, "\\f");
            break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                tputs(b, esc);
            } else {
                tput(b, (const char *)&c, 1);
            }
        }
    }
    tputs(b, "\"");
}

// Python's repr of a float: the shortest text that reads back the same; exponent form when the
// exponent is below -4 or at least 16; integral values end in ".0".
static void dump_real(struct sbuf *b, double d) {
    char s[40];
    if (isnan(d)) {
        tputs(b, "NaN");
        return;
    }
    if (isinf(d)) {
        tputs(b, d > 0 ? "Infinity" : "-Infinity");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) { // 17 significant digits always read back
        snprintf(s, sizeof s, "%.*e", prec - 1, d);
        if (strtod(s, NULL) == d) break;
    }
    // s is d.ddde[+-]XX with prec significant digits: rebuild as Python does.
    char digits[24];
    int nd = 0, exp10;
    for (const char *p = s; *p && *p != 'e'; p++)
        if (isdigit((unsigned char)*p)) digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    exp10 = atoi(strchr(s, 'e') + 1);
    if (d < 0) tputs(b, "-");
    if (exp10 < -4 || exp10 >= 16) {
        tput(b, digits, 1);
        if (nd > 1) tputs(b, "."), tput(b, digits + 1, (size_t)nd - 1);
        snprintf(s, sizeof s, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        tputs(b, s);
    } else if (exp10 < 0) {
        tputs(b, "0.");
        for (int i = 0; i < -exp10 - 1; i++) tputs(b, "0");
        tput(b, digits, (size_t)nd);
    } else {
        int ip = exp10 + 1; // digits before the point
        for (int i = 0; i < ip; i++) tput(b, i < nd ? digits + i : "0", 1);
        tputs(b, ".");
        if (nd > ip)
            tput(b, digits + ip, (size_t)(nd - ip));
        else
            tputs(b, "0");
    }
}

static void dump(struct sbuf *b, const json_t *v, int depth) {
    char s[32];
    if (depth > 512) { // the request parser limits nesting long before this
        b->oom = true;
        return;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        tputs(b, "{");
        json_object_foreach((json_t *)v, k, x) {
            if (!first) tputs(b, ", ");
            first = false;
            dump_string(b, k, strlen(k));
            tputs(b, ": ");
            dump(b, x, depth + 1);
        }
        tputs(b, "}");
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *x;
        tputs(b, "[");
        json_array_foreach(v, i, x) {
            if (i) tputs(b, ", ");
            dump(b, x, depth + 1);
        }
        tputs(b, "]");
        break;
    }
    case JSON_STRING:
        dump_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(s, sizeof s, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        tputs(b, s);
        break;
    case JSON_REAL:
        dump_real(b, json_real_value(v));
        break;
    case JSON_TRUE:
        tputs(b, "true");
        break;
    case JSON_FALSE:
        tputs(b, "false");
        break;
    case JSON_NULL:
        tputs(b, "null");
        break;
    }
}

char *tool_tojson(const json_t *v) {
    struct sbuf b = {0};
    dump(&b, v, 0);
    if (b.oom || !b.p) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

// ---- how a value is written: tool_value_form ---------------------------------------------------

// What values a schema allows, as far as the markup cares: strings, null, anything else.
enum { V_TEXT = 1, V_NULL = 2, V_OTHER = 4 };

// A value of an enum or const: its class; a string is added to texts.
static int value_class(const json_t *v, json_t *texts) {
    if (json_is_string(v)) return texts && json_array_append(texts, (json_t *)v) ? V_OTHER : V_TEXT;
    return json_is_null(v) ? V_NULL : V_OTHER;
}

static int type_class(const char *t, bool *any_text) {
    if (!strcmp(t, "string")) return *any_text = true, V_TEXT;
    return strcmp(t, "null") ? V_OTHER : V_NULL;
}

// The classes of the values s allows.  The keywords are taken in constrain.c's order ($ref, enum,
// const, anyOf, type), so both read a schema that has several of them the same way.  Strings of
// enums and consts go into texts; any_text: some string is allowed whatever it is.
static int schema_class(const json_t *s, const json_t *root, int depth, bool *any_text, json_t *texts) {
    if (depth > 32 || !json_is_object(s)) return V_OTHER; // true (any value); too deep for constrain.c too
    const json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
    const json_t *any = json_object_get(s, "anyOf"), *type = json_object_get(s, "type"), *x;
    int c = 0;
    size_t i;
    if (ref) {
        const char *r = json_string_value(ref), *name = NULL, *section = NULL;
        if (r && !strcmp(r, "#")) return schema_class(root, root, depth + 1, any_text, texts);
        if (r && !strncmp(r, "#/$defs/", 8))
            name = r + 8, section = "$defs";
        else if (r && !strncmp(r, "#/definitions/", 14))
            name = r + 14, section = "definitions";
        const json_t *def = name ? json_object_get(json_object_get(root, section), name) : NULL;
        return def ? schema_class(def, root, depth + 1, any_text, texts) : V_OTHER;
    }
    if (en) {
        json_array_foreach(en, i, x) c |= value_class(x, texts);
        return c ? c : V_OTHER;
    }
    if (co) return value_class(co, texts);
    if (json_is_array(any)) {
        json_array_foreach(any, i, x) c |= schema_class(x, root, depth + 1, any_text, texts);
        return c ? c : V_OTHER;
    }
    if (json_is_array(type)) {
        json_array_foreach(type, i, x) c |= json_is_string(x) ? type_class(json_string_value(x), any_text) : V_OTHER;
        return c ? c : V_OTHER;
    }
    return json_is_string(type) ? type_class(json_string_value(type), any_text) : V_OTHER;
}

enum tool_value tool_value_form(const json_t *schema, const json_t *root, json_t **texts) {
    bool any_text = false;
    json_t *t = json_array();
    const int c = t ? schema_class(schema, root, 0, &any_text, t) : V_OTHER;
    enum tool_value form = c == V_TEXT              ? TOOL_VALUE_TEXT
                           : c == (V_TEXT | V_NULL) ? TOOL_VALUE_TEXT_OR_NULL
                                                    : TOOL_VALUE_JSON;
    if (form == TOOL_VALUE_TEXT_OR_NULL && !any_text) { // the string "null" and null: which is meant?
        size_t i;
        const json_t *x;
        json_array_foreach(t, i, x) if (!strcmp(json_string_value(x), "null")) form = TOOL_VALUE_JSON;
    }
    if (texts) *texts = form != TOOL_VALUE_JSON && !any_text ? json_incref(t) : NULL;
    json_decref(t);
    return form;
}

// ---- parsing one call --------------------------------------------------------------------------

static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";
enum { CALL_OPEN_LEN = sizeof CALL_OPEN - 1, CALL_CLOSE_LEN = sizeof CALL_CLOSE - 1 };

static const char *find(const char *s, const char *end, const char *needle) {
    size_t k = strlen(needle);
    if ((size_t)(end - s) < k) return NULL;
    return memmem(s, (size_t)(end - s), needle, k);
}

static const char *skip_ws(const char *s, const char *end) {
    while (s < end && isspace((unsigned char)*s)) s++;
    return s;
}

static bool starts(const char *s, const char *end, const char *lit) {
    size_t k = strlen(lit);
    return (size_t)(end - s) >= k && !memcmp(s, lit, k);
}

// The tool named name[0..n) in the request's tools, or NULL.
static const json_t *find_tool(const json_t *tools, const char *name, size_t n) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *nm = json_object_get(f, "name");
        if (json_is_string(nm) && json_string_length(nm) == n && !memcmp(json_string_value(nm), name, n)) return f;
    }
    return NULL;
}

// The parameter's value is always a string (its form is text, or it is unknown): its text can be
// streamed as it comes (any other value, a text-or-null one too, is known only once whole).
static bool value_is_text(const json_t *fn, const char *pname) {
    const json_t *params = json_object_get(fn, "parameters");
    const json_t *schema = json_object_get(json_object_get(params, "properties"), pname);
    return !schema || tool_value_form(schema, params, NULL) == TOOL_VALUE_TEXT;
}

// A parameter's value, read back as tool_value_form says it was written: text for the text forms
// (null for a bare `null` where null is allowed), JSON for the others; text too for an unknown
// parameter and for JSON that does not parse (the model's own output, when nothing forced it).
static json_t *typed_value(const json_t *fn, const char *pname, const char *v, size_t n) {
    const json_t *params = json_object_get(fn, "parameters");
    const json_t *schema = json_object_get(json_object_get(params, "properties"), pname);
    if (!schema) return json_stringn(v, n);
    switch (tool_value_form(schema, params, NULL)) {
    case TOOL_VALUE_TEXT:
        return json_stringn(v, n);
    case TOOL_VALUE_TEXT_OR_NULL:
        return n == 4 && !memcmp(v, "null", 4) ? json_null() : json_stringn(v, n);
    case TOOL_VALUE_JSON:
        break;
    }
    json_t *x = json_loadb(v, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    return x ? x : json_stringn(v, n);
}

int tool_call_parse(const json_t *tools, const char *s, size_t n, char **name, char **arguments) {
    const char *end = s + n, *p = skip_ws(s, end);
    *name = *arguments = NULL;
    if (!starts(p, end, "<function=")) return -1;
    p += 10;
    const char *gt = memchr(p, '>', (size_t)(end - p));
    if (!gt || gt == p) return -1;
    const json_t *fn = find_tool(tools, p, (size_t)(gt - p));
    if (!fn) return -1;
    json_t *args = json_object();
    const char *nm = p;
    size_t nlen = (size_t)(gt - p);
    p = gt + 1;
    for (;;) {
        p = skip_ws(p, end);
        if (!starts(p, end, "<parameter=")) break;
        p += 11;
        const char *pg = memchr(p, '>', (size_t)(end - p));
        const char *close = pg ? find(pg + 1, end, "</parameter>") : NULL;
        if (!pg || pg == p || !close || memchr(p, '\n', (size_t)(pg - p))) goto bad;
        char pname[256];
        if ((size_t)(pg - p) >= sizeof pname) goto bad;
        memcpy(pname, p, (size_t)(pg - p));
        pname[pg - p] = 0;
        const char *v = pg + 1, *ve = close;
        if (v < ve && *v == '\n') v++;              // the template's newline after the tag...
        if (ve > v && ve[-1] == '\n') ve--;         // ...and before the closing one
        if (json_object_get(args, pname)) goto bad; // given twice: which one is meant?
        json_t *x = typed_value(fn, pname, v, (size_t)(ve - v));
        if (!x || json_object_set_new(args, pname, x)) goto bad;
        p = close + 12;
    }
    if (!starts(p, end, "</function>")) goto bad;
    p = skip_ws(p + 11, end);
    if (p != end) goto bad;
    *arguments = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    *name = strndup(nm, nlen);
    json_decref(args);
    if (!*arguments || !*name) {
        free(*arguments), free(*name);
        *name = *arguments = NULL;
        return -1;
    }
    return 0;
bad:
    json_decref(args);
    return -1;
}

// ---- streaming a call's arguments --------------------------------------------------------------
//
// While a call is read, its arguments go out as JSON text in pieces, each as soon as it is certain:
// "{" once "<function=NAME>" names a known tool; per parameter, when its tag is in, ",\"P\":" (and
// a string's opening quote); a string's text as it comes, escaped, holding back what could still be
// its closing "\n</parameter>" (and an unfinished UTF-8 sequence); any other value whole at its
// </parameter> (only then is it known whether it parses as JSON); "}" with the call.  These are
// tool_call_parse's rules applied in one pass, so the pieces, joined, are the arguments the call
// is handed over with (JSON_COMPACT output).  The scan stops for good where the block can no
// longer be a well-formed call; the call is then aborted when its block ends.

enum { ST_HEAD, ST_PARAMS, ST_VALUE, ST_TAIL, ST_DEAD };

static const char PARAM_OPEN[] = "<parameter=", PARAM_CLOSE[] = "</parameter>",
                  FN_OPEN[] = "<function=", FN_CLOSE[] = "</function>";

static void st_reset(struct tool_stream *st) {
    json_decref(st->names);
    sbuf_free(&st->out);
    *st = (struct tool_stream){.state = ST_HEAD};
}

static void st_emit(struct tool_parser *p, const char *s, size_t n) {
    sbuf_add(&p->st.out, s, n);
    if (n && p->stream.delta) p->stream.delta(p->sink.arg, s, n);
}

// v (taken) as jansson writes it in the arguments, a string without its quotes unless quotes;
// -1 when v is NULL (text that is not UTF-8) or out of memory.
static int st_emit_json(struct tool_parser *p, json_t *v, bool quotes) {
    char *d = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    if (!d) return -1;
    size_t n = strlen(d);
    if (quotes)
        st_emit(p, d, n);
    else
        st_emit(p, d + 1, n - 2);
    free(d);
    return 0;
}

// Is s[0..n) a prefix of lit (n may exceed it: then no)?
static bool prefix_of(const char *s, size_t n, const char *lit) {
    return n <= strlen(lit) && !memcmp(s, lit, n);
}

// Bytes at the end of s[0..n) that may be the start of the value's end ("\n</parameter>", or
// "</parameter>"), or an unfinished UTF-8 sequence.
static size_t value_holdback(const char *s, size_t n) {
    size_t hold = 0;
    for (size_t k = n < 13 ? n : 13; k > 0; k--)
        if (prefix_of(s + n - k, k, "\n</parameter>") || prefix_of(s + n - k, k, PARAM_CLOSE)) {
            hold = k;
            break;
        }
    for (size_t i = 1; i <= 3 && i <= n - hold; i++) { // the last lead byte and what it still needs
        unsigned char c = (unsigned char)s[n - hold - i];
        if ((c & 0xc0) == 0x80) continue;
        size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        if (need > i) hold += i;
        break;
    }
    return hold;
}

// Advances the scan over the call's text s[0..n); final: the block ends at n.  Sends what became certain.
static void st_scan(struct tool_parser *p, const char *s, size_t n, bool final) {
    struct tool_stream *st = &p->st;
    for (;;) {
        if (st->state == ST_HEAD) {
            const char *q = skip_ws(s + st->at, s + n), *end = s + n;
            if (!starts(q, end, FN_OPEN)) {
                if (final || !prefix_of(q, (size_t)(end - q), FN_OPEN)) st->state = ST_DEAD;
                return;
            }
            const char *name = q + sizeof FN_OPEN - 1, *gt = memchr(name, '>', (size_t)(end - name));
            if (!gt) {
                if (final) st->state = ST_DEAD;
                return;
            }
            if (gt == name || !(st->fn = find_tool(p->tools, name, (size_t)(gt - name))) ||
                !(st->names = json_object())) {
                st->state = ST_DEAD;
                return;
            }
            const char *nm = json_string_value(json_object_get(st->fn, "name"));
            st->begun = true;
            if (p->stream.begin) p->stream.begin(p->sink.arg, nm);
            st_emit(p, "{", 1);
            st->at = (size_t)(gt + 1 - s);
            st->state = ST_PARAMS;
        } else if (st->state == ST_PARAMS) {
            const char *q = skip_ws(s + st->at, s + n), *end = s + n;
            const size_t left = (size_t)(end - q);
            if (starts(q, end, FN_CLOSE)) {
                st->at = (size_t)(q - s) + sizeof FN_CLOSE - 1;
                st->state = ST_TAIL;
                continue;
            }
            if (!starts(q, end, PARAM_OPEN)) {
                if (final || (!prefix_of(q, left, PARAM_OPEN) && !prefix_of(q, left, FN_CLOSE))) st->state = ST_DEAD;
                return;
            }
            // The name runs to the first '>': no newline in it, shorter than pname.
            const char *pn = q + sizeof PARAM_OPEN - 1, *pg = memchr(pn, '>', (size_t)(end - pn));
            const char *upto = pg ? pg : end;
            if (memchr(pn, '\n', (size_t)(upto - pn)) || (size_t)(upto - pn) >= sizeof st->pname || pg == pn ||
                (!pg && final)) {
                st->state = ST_DEAD;
                return;
            }
            if (!pg) return;
            memcpy(st->pname, pn, (size_t)(pg - pn));
            st->pname[pg - pn] = 0;
            if (json_object_get(st->names, st->pname) || json_object_set_new(st->names, st->pname, json_true())) {
                st->state = ST_DEAD; // given twice, or a name that is not UTF-8
                return;
            }
            st->text = value_is_text(st->fn, st->pname);
            if (json_object_size(st->names) > 1) st_emit(p, ",", 1);
            if (st_emit_json(p, json_string(st->pname), true)) {
                st->state = ST_DEAD;
                return;
            }
            st_emit(p, st->text ? ":\"" : ":", st->text ? 2 : 1);
            st->at = st->sent = st->look = (size_t)(pg + 1 - s);
            st->lead = false;
            st->state = ST_VALUE;
        } else if (st->state == ST_VALUE) {
            const char *v = s + st->at;
            if (!st->lead && n > st->at) { // the template's newline after the tag is not the value's
                st->lead = true;
                if (*v == '\n') st->sent = st->at + 1;
            }
            const char *close = find(s + st->look, s + n, PARAM_CLOSE);
            if (!close) {
                st->look = n >= sizeof PARAM_CLOSE ? n - (sizeof PARAM_CLOSE - 2) : 0;
                if (st->look < st->at) st->look = st->at;
                if (final)
                    st->state = ST_DEAD;
                else if (st->text && st->lead && n > st->sent) {
                    size_t k = n - st->sent - value_holdback(s + st->sent, n - st->sent);
                    if (k && st_emit_json(p, json_stringn(s + st->sent, k), false)) st->state = ST_DEAD;
                    st->sent += k;
                }
                return;
            }
            const char *vs = v < close && *v == '\n' ? v + 1 : v, *ve = close; // tool_call_parse's trims
            if (ve > vs && ve[-1] == '\n') ve--;
            if (st->text) {
                if (s + st->sent < ve &&
                    st_emit_json(p, json_stringn(s + st->sent, (size_t)(ve - s - st->sent)), false)) {
                    st->state = ST_DEAD;
                    return;
                }
                st_emit(p, "\"", 1);
            } else if (st_emit_json(p, typed_value(st->fn, st->pname, vs, (size_t)(ve - vs)), true)) {
                st->state = ST_DEAD; // (typed_value: JSON when the text parses as JSON, else a string)
                return;
            }
            st->at = (size_t)(close - s) + sizeof PARAM_CLOSE - 1;
            st->state = ST_PARAMS;
        } else { // ST_TAIL (whitespace until the block's end, checked by the parse) or ST_DEAD
            return;
        }
    }
}

// ---- the incremental parser --------------------------------------------------------------------

void tool_parser_init(struct tool_parser *p, const json_t *tools, struct tool_sink sink) {
    memset(p, 0, sizeof *p);
    p->tools = tools;
    p->sink = sink;
    p->st.state = ST_HEAD;
}

static void buf_drop(struct tool_parser *p, size_t k) {
    memmove(p->buf.p, p->buf.p + k, p->buf.len - k);
    p->buf.len -= k;
}

static void content(struct tool_parser *p, const char *s, size_t n) {
    if (n) p->sink.content(p->sink.arg, s, n);
}

// Longest suffix of s[0..n) that is a proper prefix of "<tool_call>".
static size_t open_prefix(const char *s, size_t n) {
    for (size_t k = n < CALL_OPEN_LEN - 1 ? n : CALL_OPEN_LEN - 1; k > 0; k--)
        if (!memcmp(s + n - k, CALL_OPEN, k)) return k;
    return 0;
}

// Text outside calls: emit all but what may still be "<tool_call>" or whitespace before it.
// Whitespace right after a call is dropped too.
static void flush_text(struct tool_parser *p) {
    if (p->after_call) {
        size_t a = 0;
        while (a < p->buf.len && isspace((unsigned char)p->buf.p[a])) a++;
        buf_drop(p, a);
        if (p->buf.len) p->after_call = false;
    }
    const char *open = find(p->buf.p, p->buf.p + p->buf.len, CALL_OPEN);
    size_t upto = open ? (size_t)(open - p->buf.p) : p->buf.len;
    size_t keep = open ? 0 : open_prefix(p->buf.p, p->buf.len);
    size_t text = upto - keep, ws = text;
    while (ws > 0 && isspace((unsigned char)p->buf.p[ws - 1])) ws--; // whitespace before a call is dropped
    content(p, p->buf.p, ws);
    if (open) {
        buf_drop(p, upto + CALL_OPEN_LEN);
        p->in_call = true;
        st_reset(&p->st);
    } else {
        buf_drop(p, ws);
    }
}

// A begun call's streamed arguments did not turn out to be a call.
static void call_abort(struct tool_parser *p) {
    if (p->st.begun && p->stream.abort) p->stream.abort(p->sink.arg);
    st_reset(&p->st);
}

static void end_call(struct tool_parser *p, const char *close) {
    char *name, *args;
    size_t n = (size_t)(close - p->buf.p);
    st_scan(p, p->buf.p, n, true);
    if (!tool_call_parse(p->tools, p->buf.p, n, &name, &args)) {
        struct tool_stream *st = &p->st;
        const size_t al = strlen(args);
        if (st->begun && st->state == ST_TAIL && st->out.len + 1 == al && !memcmp(st->out.p, args, al - 1)) {
            st_emit(p, "}", 1);
        } else { // (never: the scan applies the parse's rules) stream the whole arguments anew
            p->mismatches++;
            call_abort(p);
            if (p->stream.begin) p->stream.begin(p->sink.arg, name);
            st_emit(p, args, al);
        }
        st_reset(&p->st);
        p->sink.call(p->sink.arg, name, args);
        p->n_calls++;
        free(name), free(args);
    } else { // malformed: the whole block as text
        call_abort(p);
        content(p, CALL_OPEN, CALL_OPEN_LEN);
        content(p, p->buf.p, n + CALL_CLOSE_LEN);
    }
    buf_drop(p, n + CALL_CLOSE_LEN);
    p->in_call = false;
    p->after_call = true;
}

void tool_parser_feed(struct tool_parser *p, const char *s, size_t n) {
    tput(&p->buf, s, n);
    if (p->buf.oom) return;
    for (;;) {
        if (p->in_call) {
            const char *close = find(p->buf.p, p->buf.p + p->buf.len, CALL_CLOSE);
            if (!close) {
                st_scan(p, p->buf.p, p->buf.len, false);
                return;
            }
            end_call(p, close);
        } else {
            flush_text(p);
            if (!p->in_call) return;
        }
    }
}

void tool_parser_finish(struct tool_parser *p) {
    if (p->in_call) { // never closed: the model stopped mid-call
        call_abort(p);
        content(p, CALL_OPEN, CALL_OPEN_LEN);
        content(p, p->buf.p, p->buf.len);
    } else if (!p->n_calls) { // held whitespace and a partial "<tool_c" are text after all
        content(p, p->buf.p, p->buf.len);
    } else { // after calls, trailing whitespace is dropped
        size_t b = p->buf.len;
        while (b > 0 && isspace((unsigned char)p->buf.p[b - 1])) b--;
        content(p, p->buf.p, b);
    }
    p->buf.len = 0;
    p->in_call = false;
}

void tool_parser_free(struct tool_parser *p) {
    free(p->buf.p);
    memset(&p->buf, 0, sizeof p->buf);
    st_reset(&p->st);
}
