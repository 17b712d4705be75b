// constrain.c: structured output by constrained greedy decoding (see constrain.h).
#include "constrain.h"

#include "toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- compiled schemas ----------------------------------------------------------------------------

enum kind {
    K_ANY,
    K_OBJECT,
    K_ARRAY,
    K_STRING,
    K_NUMBER,
    K_INTEGER,
    K_LITS,
    K_ANYOF,
    K_REF,
    K_SEQ, // the tool-call grammar: its children (alts) one after another
    K_RAW, // free text up to and including a terminator (lits[0]); "</" never inside
};

struct lit {
    char *s; // a key as JSON text ("\"city\"") or a literal value as compact JSON
    size_t n;
    int prop; // keys: the property's index
};

struct cnode {
    enum kind kind;
    // K_OBJECT
    bool any_keys; // keys are any strings and values any JSON (json_object)
    int n_props;
    struct lit *keys;     // [n_props] sorted by text
    struct cnode **props; // [n_props] by property index
    uint64_t required;    // bit i: property i must be given
    // K_ARRAY
    struct cnode *items;
    // K_LITS
    int n_lits;
    struct lit *lits; // sorted by text
    // K_ANYOF
    int n_alts;
    struct cnode **alts;
    // K_REF
    struct cnode *target;
    int minlen;               // bytes of the shortest value (for closing a document in time)
    struct cnode *next_alloc; // the schema's list of its nodes
};

struct cschema {
    struct cnode *root;
    struct cnode *nodes; // every node allocated for this schema
};

static struct lit any_lit_texts[] = {{"false", 5, 0}, {"null", 4, 0}, {"true", 4, 0}};
static struct cnode any_node = {.kind = K_ANY, .minlen = 1};
static struct cnode any_string = {.kind = K_STRING, .minlen = 2};
static struct cnode any_number = {.kind = K_NUMBER, .minlen = 1};
static struct cnode any_lits = {.kind = K_LITS, .n_lits = 3, .lits = any_lit_texts, .minlen = 4};
static struct cnode any_array = {.kind = K_ARRAY, .items = &any_node, .minlen = 2};
static struct cnode any_object = {.kind = K_OBJECT, .any_keys = true, .minlen = 2};

enum { FAR = 1 << 20 }; // a value that cannot be finished (or not yet known)

// Bytes to give the required properties in mask (each "key":value, with commas between).
static int props_len(const struct cnode *n, uint64_t mask) {
    int len = 0, k = 0;
    for (int i = 0; i < n->n_props; i++) {
        const struct lit *key = &n->keys[i];
        if (!(mask >> key->prop & 1)) continue;
        len += (int)key->n + 1 + n->props[key->prop]->minlen + (k++ ? 1 : 0);
        if (len > FAR) return FAR;
    }
    return len;
}

static int node_minlen(const struct cnode *n) {
    int m = FAR;
    switch (n->kind) {
    case K_OBJECT:
        return n->any_keys ? 2 : 2 + props_len(n, n->required);
    case K_ARRAY:
        return 2;
    case K_STRING:
        return 2;
    case K_NUMBER:
    case K_INTEGER:
    case K_ANY:
        return 1;
    case K_LITS:
        for (int i = 0; i < n->n_lits; i++) m = (int)n->lits[i].n < m ? (int)n->lits[i].n : m;
        return m;
    case K_ANYOF:
        for (int i = 0; i < n->n_alts; i++) m = n->alts[i]->minlen < m ? n->alts[i]->minlen : m;
        return m;
    case K_REF:
        return n->target ? n->target->minlen : FAR;
    case K_SEQ:
        m = 0;
        for (int i = 0; i < n->n_alts && m < FAR; i++) m += n->alts[i]->minlen;
        return m < FAR ? m : FAR;
    case K_RAW:
        return (int)n->lits[0].n;
    }
    return FAR;
}

// Shortest values, to a fixed point (recursive schemas through $ref).
static void compute_minlen(struct cschema *c) {
    for (struct cnode *n = c->nodes; n; n = n->next_alloc) n->minlen = FAR;
    for (int round = 0, changed = 1; changed && round < 256; round++) {
        changed = 0;
        for (struct cnode *n = c->nodes; n; n = n->next_alloc) {
            int m = node_minlen(n);
            if (m < n->minlen) n->minlen = m, changed = 1;
        }
    }
}

struct compiler {
    struct cschema *c;
    const json_t *root_json;
    json_t *refs;           // "#/$defs/NAME" -> node address (as an integer)
    struct cnode *root_ref; // "#"
    char *err;
    size_t errlen;
    int n_nodes;
};

static struct cnode *node_new(struct compiler *cc, enum kind k) {
    struct cnode *n = calloc(1, sizeof *n);
    if (!n || ++cc->n_nodes > 100000) {
        free(n);
        snprintf(cc->err, cc->errlen, n ? "the schema is too large" : "out of memory");
        return NULL;
    }
    n->kind = k;
    n->next_alloc = cc->c->nodes;
    cc->c->nodes = n;
    return n;
}

static int lit_cmp(const void *a, const void *b) {
    const struct lit *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, m);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int fail(struct compiler *cc, const char *fmt, const char *arg) {
    snprintf(cc->err, cc->errlen, fmt, arg);
    return -1;
}

static struct cnode *compile(struct compiler *cc, const json_t *s, int depth);

static const char *const known_keywords[] = {
    "type",   "properties",  "required", "additionalProperties", "items", "enum",    "const",   "anyOf",
    "$defs",  "definitions", "$ref",     "description",          "title", "default", "$schema", "$id",
    "strict", "name"};

static struct cnode *compile_ref(struct compiler *cc, const char *ref, int depth) {
    if (!strcmp(ref, "#")) return cc->root_ref;
    const char *name = NULL, *section = NULL;
    if (!strncmp(ref, "#/$defs/", 8))
        name = ref + 8, section = "$defs";
    else if (!strncmp(ref, "#/definitions/", 14))
        name = ref + 14, section = "definitions";
    const json_t *def = name ? json_object_get(json_object_get(cc->root_json, section), name) : NULL;
    if (!def) return fail(cc, "$ref \"%.200s\" does not name a schema in $defs", ref), NULL;
    json_t *known = json_object_get(cc->refs, ref);
    if (known) return (struct cnode *)(uintptr_t)json_integer_value(known);
    struct cnode *r = node_new(cc, K_REF); // in the map before its body: recursion ends here
    if (!r || json_object_set_new(cc->refs, ref, json_integer((json_int_t)(uintptr_t)r))) return NULL;
    return (r->target = compile(cc, def, depth + 1)) ? r : NULL;
}

static struct cnode *compile_lits(struct compiler *cc, const json_t *values) {
    size_t n = json_array_size(values);
    if (n == 0) return fail(cc, "%s must not be empty", "enum"), NULL;
    if (n > CONSTRAIN_MAX_ENUM) {
        char m[32];
        snprintf(m, sizeof m, "%zu", n);
        return fail(cc, "enum has %s values (at most 1024)", m), NULL;
    }
    struct cnode *nd = node_new(cc, K_LITS);
    if (!nd || !(nd->lits = calloc(n, sizeof *nd->lits))) return NULL;
    for (size_t i = 0; i < n; i++) {
        char *t = json_dumps(json_array_get(values, i), JSON_COMPACT | JSON_ENCODE_ANY);
        if (!t) return fail(cc, "%s", "out of memory"), NULL;
        nd->lits[nd->n_lits++] = (struct lit){t, strlen(t), 0};
    }
    qsort(nd->lits, n, sizeof *nd->lits, lit_cmp);
    return nd;
}

static struct cnode *compile_object(struct compiler *cc, const json_t *s, int depth) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(cc, "%s must be an object", "properties"), NULL;
    if (add && !json_is_false(add))
        return fail(cc, "%s must be false (or absent): objects have exactly their properties", "additionalProperties"),
               NULL;
    if (req && !json_is_array(req)) return fail(cc, "%s must be an array of property names", "required"), NULL;
    if (!props && !add) return &any_object;
    size_t n = props ? json_object_size(props) : 0;
    if (n > CONSTRAIN_MAX_PROPS) return fail(cc, "an object may have at most %s properties", "64"), NULL;
    struct cnode *nd = node_new(cc, K_OBJECT);
    if (!nd || !(nd->keys = calloc(n + 1, sizeof *nd->keys)) || !(nd->props = calloc(n + 1, sizeof *nd->props)))
        return fail(cc, "%s", "out of memory"), NULL;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        json_t *ks = json_string(k);
        char *t = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(ks);
        if (!t) return fail(cc, "%s", "out of memory"), NULL;
        int i = nd->n_props++;
        nd->keys[i] = (struct lit){t, strlen(t), i};
        if (!(nd->props[i] = compile(cc, v, depth + 1))) return NULL;
    }
    size_t ri;
    const json_t *r;
    json_array_foreach(req, ri, r) {
        int found = -1;
        char *t = json_is_string(r) ? json_dumps(r, JSON_ENCODE_ANY | JSON_COMPACT) : NULL; // as the keys are kept
        for (int i = 0; i < nd->n_props && t; i++)
            if (!strcmp(nd->keys[i].s, t)) found = i;
        free(t);
        if (found < 0)
            return fail(cc, "required names \"%.200s\", which is not in properties",
                        json_is_string(r) ? json_string_value(r) : "(not a string)"),
                   NULL;
        nd->required |= 1ULL << found;
    }
    qsort(nd->keys, (size_t)nd->n_props, sizeof *nd->keys, lit_cmp);
    return nd;
}

static struct cnode *compile_type(struct compiler *cc, const json_t *s, const char *type, int depth) {
    if (!strcmp(type, "object")) return compile_object(cc, s, depth);
    if (!strcmp(type, "array")) {
        const json_t *items = json_object_get(s, "items");
        if (!items) return &any_array;
        struct cnode *nd = node_new(cc, K_ARRAY);
        return nd && (nd->items = compile(cc, items, depth + 1)) ? nd : NULL;
    }
    if (!strcmp(type, "string")) return &any_string;
    if (!strcmp(type, "number")) return &any_number;
    if (!strcmp(type, "integer")) {
        struct cnode *nd = node_new(cc, K_INTEGER);
        return nd;
    }
    json_t *lits = !strcmp(type, "boolean") ? json_pack("[b, b]", 0, 1)
                   : !strcmp(type, "null")  ? json_pack("[n]")
                                            : NULL;
    if (!lits) return fail(cc, "type \"%.64s\" is unknown", type), NULL;
    struct cnode *nd = compile_lits(cc, lits);
    json_decref(lits);
    return nd;
}

static struct cnode *compile(struct compiler *cc, const json_t *s, int depth) {
    if (depth > 32) return fail(cc, "the schema nests deeper than %s levels", "32"), NULL;
    if (json_is_true(s)) return &any_node;
    if (!json_is_object(s)) return fail(cc, "%s", "a schema must be an object"), NULL;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known_keywords / sizeof known_keywords[0]; i++)
            ok |= !strcmp(k, known_keywords[i]);
        if (!ok) return fail(cc, "the JSON Schema keyword \"%.64s\" is not supported", k), NULL;
    }
    const json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
    const json_t *any = json_object_get(s, "anyOf"), *type = json_object_get(s, "type");
    if (ref) {
        if (!json_is_string(ref)) return fail(cc, "%s must be a string", "$ref"), NULL;
        return compile_ref(cc, json_string_value(ref), depth);
    }
    if (en) {
        if (!json_is_array(en)) return fail(cc, "%s must be an array", "enum"), NULL;
        return compile_lits(cc, en);
    }
    if (co) {
        json_t *one = json_pack("[O]", co);
        struct cnode *nd = one ? compile_lits(cc, one) : NULL;
        json_decref(one);
        return nd;
    }
    if (any || json_is_array(type)) {
        const json_t *list = any ? any : type;
        size_t n = json_array_size(list);
        if (!json_is_array(list) || n == 0 || n > 16)
            return fail(cc, "%s must be a list of 1 to 16 schemas", any ? "anyOf" : "type"), NULL;
        struct cnode *nd = node_new(cc, K_ANYOF);
        if (!nd || !(nd->alts = calloc(n, sizeof *nd->alts))) return fail(cc, "%s", "out of memory"), NULL;
        for (size_t i = 0; i < n; i++) {
            const json_t *alt = json_array_get(list, i);
            if (!any) { // "type": [a, b]: the same schema once per type
                if (!json_is_string(alt)) return fail(cc, "%s entries must be strings", "type"), NULL;
                if (!(nd->alts[i] = compile_type(cc, s, json_string_value(alt), depth))) return NULL;
            } else if (!(nd->alts[i] = compile(cc, alt, depth + 1))) {
                return NULL;
            }
            nd->n_alts++;
        }
        return nd;
    }
    if (type && !json_is_string(type)) return fail(cc, "%s must be a string or a list of strings", "type"), NULL;
    if (type) return compile_type(cc, s, json_string_value(type), depth);
    if (json_object_get(s, "properties")) return compile_object(cc, s, depth);
    return &any_node;
}

int constrain_compile(const json_t *schema, struct cschema **out, char *err, size_t errlen) {
    *out = NULL;
    struct cschema *c = calloc(1, sizeof *c);
    struct compiler cc = {.c = c, .root_json = schema, .refs = json_object(), .err = err, .errlen = errlen};
    if (!c || !cc.refs) {
        free(c);
        json_decref(cc.refs);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!schema) {
        c->root = &any_object;
    } else if ((cc.root_ref = node_new(&cc, K_REF)) && (c->root = compile(&cc, schema, 0))) {
        cc.root_ref->target = c->root;
    } else {
        c->root = NULL;
    }
    json_decref(cc.refs);
    if (c->root) compute_minlen(c);
    if (c->root && c->root->minlen >= FAR) {
        snprintf(err, errlen, "the schema allows no finite document (a $ref cycle with no way out)");
        c->root = NULL;
    }
    if (!c->root) {
        constrain_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

// ---- tool calls ----------------------------------------------------------------------------------

static struct cnode *lit_node(struct compiler *cc, enum kind k, const char *text) {
    struct cnode *n = node_new(cc, k);
    if (!n || !(n->lits = calloc(1, sizeof *n->lits)) || !(n->lits[0].s = strdup(text))) {
        snprintf(cc->err, cc->errlen, "out of memory");
        return NULL;
    }
    n->lits[0].n = strlen(text);
    n->n_lits = 1;
    return n;
}

static bool seq_add(struct compiler *cc, struct cnode *seq, struct cnode *part) {
    if (!part) return false;
    struct cnode **a = realloc(seq->alts, sizeof *a * (size_t)(seq->n_alts + 1));
    if (!a) return fail(cc, "%s", "out of memory"), false;
    seq->alts = a;
    seq->alts[seq->n_alts++] = part;
    return true;
}

// A text-form parameter limited to some strings (tool_value_form's texts, with "null" where null
// is allowed): each as its raw text followed by the closing markup, one literal each, so that ""
// and strings that are prefixes of others are values too.  A string holding "</parameter>" or
// "</tool_call>" would end the call early where the parser reads it back: refused.
static struct cnode *compile_texts(struct compiler *cc, const json_t *texts, bool null, const char *close) {
    const size_t n = json_array_size(texts) + null, nc = strlen(close);
    struct cnode *nd = node_new(cc, K_LITS);
    if (!nd || !(nd->lits = calloc(n, sizeof *nd->lits))) return fail(cc, "%s", "out of memory"), NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(texts, i);
        const char *t = v ? json_string_value(v) : "null";
        const size_t len = v ? json_string_length(v) : 4;
        if (memmem(t, len, "</parameter>", 12) || memmem(t, len, "</tool_call>", 12))
            return fail(cc, "the value \"%.64s\" cannot be written inside a tool call's markup", t), NULL;
        char *lit = malloc(len + nc + 1);
        if (!lit) return fail(cc, "%s", "out of memory"), NULL;
        memcpy(lit, t, len);
        memcpy(lit + len, close, nc + 1);
        nd->lits[nd->n_lits++] = (struct lit){lit, len + nc, 0};
    }
    qsort(nd->lits, n, sizeof *nd->lits, lit_cmp);
    return nd;
}

// A parameter's VALUE and the markup that closes it, written as tool_value_form says (the parser
// reads it back by the same decision): free text up to the closing markup ("</" only there),
// one of the schema's strings, or compact JSON of the schema.  The schema is compiled in every
// case, so that a text parameter's unsupported keywords are refused as any other's are.
static bool add_value(struct compiler *cc, struct cnode *seq, const json_t *schema, const json_t *params) {
    static const char close[] = "\n</parameter>\n";
    struct cnode *json = compile(cc, schema, 1);
    if (!json) return false;
    json_t *texts;
    const enum tool_value form = tool_value_form(schema, params, &texts);
    bool ok;
    if (form == TOOL_VALUE_JSON)
        ok = seq_add(cc, seq, json) && seq_add(cc, seq, lit_node(cc, K_LITS, close));
    else if (!texts)
        ok = seq_add(cc, seq, lit_node(cc, K_RAW, close));
    else
        ok = seq_add(cc, seq, compile_texts(cc, texts, form == TOOL_VALUE_TEXT_OR_NULL, close));
    json_decref(texts);
    return ok;
}

// One function's call, as the template asks for it:
//   <tool_call>\n<function=NAME>\n{<parameter=P>\nVALUE\n</parameter>\n}</function>\n</tool_call>
// with the required parameters in the schema's order, each VALUE as add_value writes it.
static struct cnode *compile_call(struct compiler *cc, const json_t *fn) {
    const char *name = json_string_value(json_object_get(fn, "name"));
    const json_t *params = json_object_get(fn, "parameters"), *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    char head[160];
    snprintf(head, sizeof head, "<tool_call>\n<function=%s>\n", name ? name : "");
    struct cnode *seq = node_new(cc, K_SEQ);
    cc->root_json = params; // $ref inside the parameters resolves there
    json_object_clear(cc->refs);
    if (!seq || !seq_add(cc, seq, lit_node(cc, K_LITS, head))) return NULL;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        bool required = false;
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), k);
        if (!required) continue;
        char open[320];
        if (strlen(k) > 200) return fail(cc, "parameter name \"%.64s...\" is too long", k), NULL;
        if (strpbrk(k, ">\n")) // the parser reads a name up to its '>', on one line
            return fail(cc, "parameter name \"%.64s\" cannot be written in a tool call's markup", k), NULL;
        snprintf(open, sizeof open, "<parameter=%s>\n", k);
        if (!seq_add(cc, seq, lit_node(cc, K_LITS, open)) || !add_value(cc, seq, v, params)) return NULL;
    }
    return seq_add(cc, seq, lit_node(cc, K_LITS, "</function>\n</tool_call>")) ? seq : NULL;
}

int constrain_compile_tool_call(const json_t *tools, const char *name, struct cschema **out, char *err, size_t errlen) {
    *out = NULL;
    struct cschema *c = calloc(1, sizeof *c);
    struct compiler cc = {.c = c, .refs = json_object(), .err = err, .errlen = errlen};
    struct cnode *any = c && cc.refs ? node_new(&cc, K_ANYOF) : NULL;
    size_t i;
    const json_t *t;
    bool ok = any != NULL;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (!ok || (name && (!fname || strcmp(fname, name)))) continue;
        struct cnode *call = any->n_alts < 16 ? compile_call(&cc, fn) : NULL;
        ok = call && seq_add(&cc, any, call);
        if (!call && any->n_alts >= 16) snprintf(err, errlen, "tool_choice \"required\" handles at most 16 tools");
    }
    json_decref(cc.refs);
    if (ok && !any->n_alts) ok = false, snprintf(err, errlen, "no tool named \"%.64s\"", name ? name : "");
    if (c) c->root = ok ? any : NULL;
    if (ok) compute_minlen(c);
    if (!ok) {
        constrain_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void constrain_free(struct cschema *c) {
    if (!c) return;
    for (struct cnode *n = c->nodes, *next; n; n = next) {
        next = n->next_alloc;
        for (int i = 0; i < n->n_props; i++) free(n->keys[i].s);
        for (int i = 0; i < n->n_lits; i++) free(n->lits[i].s);
        free(n->keys), free(n->props), free(n->lits), free(n->alts);
        free(n);
    }
    free(c);
}

// ---- the matcher ---------------------------------------------------------------------------------

enum st {
    ST_START, // nothing of the value yet
    ST_OBJ_OPEN,
    ST_OBJ_KEY,
    ST_OBJ_KEYG,
    ST_OBJ_COLON,
    ST_OBJ_VALUE,
    ST_OBJ_AFTER,
    ST_OBJ_NEXT,
    ST_ARR_OPEN,
    ST_ARR_VALUE,
    ST_ARR_AFTER,
    ST_STR,
    ST_STR_ESC,
    ST_STR_U,
    ST_NUM_SIGN,
    ST_NUM_ZERO,
    ST_NUM_INT,
    ST_NUM_FRAC0,
    ST_NUM_FRAC,
    ST_NUM_EXP0,
    ST_NUM_EXPS,
    ST_NUM_EXP,
    ST_LIT,
    ST_SEQ, // k: children started
    ST_RAW, // k: terminator bytes matched; prop: 1 after a '<' outside the terminator
};

struct frame {
    const struct cnode *n;
    uint8_t st;
    uint16_t k;      // bytes of the literal or key matched; \u digits seen; digits of a number's part
    uint16_t lo, hi; // candidates among the sorted literals or keys
    int16_t prop;    // the property whose value follows
    uint64_t seen;   // properties given
};

struct thread {
    int depth;
    bool dead;
    struct frame f[CONSTRAIN_MAX_DEPTH];
};

struct cstate {
    const struct cschema *c;
    int n;
    struct thread t[CONSTRAIN_MAX_THREADS];
};

static void thread_init(struct thread *t, const struct cnode *root) {
    t->depth = 1;
    t->dead = false;
    t->f[0] = (struct frame){.n = root};
}

struct cstate *cstate_new(const struct cschema *c) {
    struct cstate *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->c = c;
    s->n = c ? 1 : 0; // no schema: scratch for cstate_copy only
    if (c) thread_init(&s->t[0], c->root);
    return s;
}

void cstate_free(struct cstate *s) {
    free(s);
}

static void thread_copy(struct thread *d, const struct thread *s) {
    d->depth = s->depth;
    d->dead = s->dead;
    memcpy(d->f, s->f, sizeof *s->f * (size_t)s->depth);
}

void cstate_copy(struct cstate *dst, const struct cstate *src) {
    dst->c = src->c;
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) thread_copy(&dst->t[i], &src->t[i]);
}

static bool push(struct thread *t, const struct cnode *n) {
    if (t->depth == CONSTRAIN_MAX_DEPTH) return false;
    t->f[t->depth++] = (struct frame){.n = n};
    return true;
}

// The value on top is complete: pop it and tell its parent.
static void pop(struct thread *t) {
    if (--t->depth == 0) return;
    struct frame *p = &t->f[t->depth - 1];
    if (p->st == ST_OBJ_KEYG)
        p->st = ST_OBJ_COLON;
    else if (p->st == ST_OBJ_VALUE)
        p->st = ST_OBJ_AFTER;
    else if (p->st == ST_ARR_VALUE)
        p->st = ST_ARR_AFTER; // ST_SEQ: its count already moved on
}

// Narrows [lo, hi) of sorted texts to those whose byte k is b (keys: of properties not given
// yet, seen); false when none is left.
static bool narrow(const struct lit *l, struct frame *f, unsigned char b, uint64_t seen) {
    int lo = f->hi, hi = f->lo;
    for (int i = f->lo; i < f->hi; i++)
        if (l[i].n > f->k && (unsigned char)l[i].s[f->k] == b && !(seen >> l[i].prop & 1)) {
            if (i < lo) lo = i;
            hi = i + 1;
        }
    if (lo >= hi) return false;
    f->lo = (uint16_t)lo, f->hi = (uint16_t)hi, f->k++;
    return true;
}

static bool is_digit(unsigned char b) {
    return b >= '0' && b <= '9';
}

// Numbers are bounded to what the server's own JSON parser (jansson) reads back, in tool-call
// arguments and json_schema answers alike.  jansson reads a number without a fraction or an
// exponent as a json_int_t (long long: -9223372036854775808 .. 9223372036854775807) and refuses
// one past it, and any other as a double, refusing one that overflows.  At most 18 digits before
// the point keep every integer within long long (10^18 - 1 < 2^63 - 1) with no comparison of a
// 19th digit to make; the values it leaves out, 10^18 .. 2^63 - 1, are past what a schema asks
// for in practice.  At most 2 exponent digits keep a real finite (below 10^18 * 10^99) and its
// smallest non-zero value normal (10^-18 * 10^-99); at most 18 digits after the point are more
// than a double holds (17 significant digits), so longer fractions would only spend tokens.
enum { NUM_INT_DIGITS = 18, NUM_FRAC_DIGITS = 18, NUM_EXP_DIGITS = 2 };

static bool number_complete(uint8_t st) {
    return st == ST_NUM_ZERO || st == ST_NUM_INT || st == ST_NUM_FRAC || st == ST_NUM_EXP;
}

// The top value may end here (a number, or a literal that is whole).
static bool frame_complete(const struct frame *f) {
    if (f->st == ST_LIT) return f->n->lits[f->lo].n == f->k;
    if (f->st == ST_SEQ) return f->k == f->n->n_alts;
    return number_complete(f->st);
}

static bool feed_thread(struct cstate *s, int ti, unsigned char b);

// A value starts with byte b.
static bool start(struct cstate *s, int ti, struct frame *f, unsigned char b) {
    const struct cnode *n = f->n;
    switch (n->kind) {
    case K_ANY:
        f->n = b == '{'                  ? &any_object
               : b == '['                ? &any_array
               : b == '"'                ? &any_string
               : b == '-' || is_digit(b) ? &any_number
                                         : &any_lits;
        return start(s, ti, f, b);
    case K_OBJECT:
        if (b != '{') return false;
        f->st = ST_OBJ_OPEN;
        return true;
    case K_ARRAY:
        if (b != '[') return false;
        f->st = ST_ARR_OPEN;
        return true;
    case K_STRING:
        if (b != '"') return false;
        f->st = ST_STR;
        return true;
    case K_NUMBER:
    case K_INTEGER:
        f->st = b == '-' ? ST_NUM_SIGN : b == '0' ? ST_NUM_ZERO : is_digit(b) ? ST_NUM_INT : ST_START;
        f->k = is_digit(b);
        return f->st != ST_START;
    case K_LITS:
        f->st = ST_LIT, f->k = 0, f->lo = 0, f->hi = (uint16_t)n->n_lits;
        return narrow(n->lits, f, b, 0);
    case K_REF: { // follow the chain; a chain that never reaches a value (A -> A) matches nothing
        const struct cnode *x = n;
        for (int g = 0; x && x->kind == K_REF && g < 64; g++) x = x->target;
        if (!x || x->kind == K_REF) return false;
        f->n = x;
        return start(s, ti, f, b);
    }
    case K_SEQ:
        f->st = ST_SEQ, f->k = 0;
        return feed_thread(s, ti, b);
    case K_RAW:
        f->st = ST_RAW, f->k = 0, f->prop = 0;
        return feed_thread(s, ti, b);
    case K_ANYOF:
        for (int i = 1; i < n->n_alts && s->n < CONSTRAIN_MAX_THREADS; i++) {
            int nt = s->n++;
            thread_copy(&s->t[nt], &s->t[ti]);
            s->t[nt].f[s->t[nt].depth - 1].n = n->alts[i];
            s->t[nt].dead = !feed_thread(s, nt, b);
        }
        f->n = n->alts[0];
        return start(s, ti, f, b);
    }
    return false;
}

// An object key begins (the opening quote was b == '"').
static bool key_start(struct thread *t, struct frame *f) {
    if (f->n->any_keys) {
        f->st = ST_OBJ_KEYG;
        if (!push(t, &any_string)) return false;
        t->f[t->depth - 1].st = ST_STR;
        return true;
    }
    f->st = ST_OBJ_KEY, f->k = 0, f->lo = 0, f->hi = (uint16_t)f->n->n_props;
    return narrow(f->n->keys, f, '"', f->seen);
}

static bool feed_thread(struct cstate *s, int ti, unsigned char b) {
    struct thread *t = &s->t[ti];
    for (;;) {
        if (t->depth == 0) return false; // the document is complete: nothing may follow
        struct frame *f = &t->f[t->depth - 1];
        switch (f->st) {
        case ST_START:
            return start(s, ti, f, b);
        case ST_OBJ_OPEN:
            if (b == '}' && !f->n->required) return pop(t), true;
            return b == '"' && key_start(t, f);
        case ST_OBJ_NEXT:
            return b == '"' && key_start(t, f);
        case ST_OBJ_KEY: {
            if (!narrow(f->n->keys, f, b, f->seen)) return false; // each property once
            const struct lit *k = &f->n->keys[f->lo];
            if (k->n != f->k) return true; // keys end with their quote: a whole key is the only candidate
            f->prop = (int16_t)k->prop;
            f->st = ST_OBJ_COLON;
            return true;
        }
        case ST_OBJ_KEYG:
            return false; // the key's string frame is on top while it lasts
        case ST_OBJ_COLON:
            if (b != ':') return false;
            f->st = ST_OBJ_VALUE;
            if (!f->n->any_keys) f->seen |= 1ULL << f->prop;
            return push(t, f->n->any_keys ? &any_node : f->n->props[f->prop]);
        case ST_OBJ_AFTER: // a comma only when a property is left to give
            if (b == ',' && (f->n->any_keys || f->seen != (f->n->n_props == 64 ? ~0ULL : (1ULL << f->n->n_props) - 1)))
                return f->st = ST_OBJ_NEXT, true;
            if (b == '}' && !(f->n->required & ~f->seen)) return pop(t), true;
            return false;
        case ST_ARR_OPEN:
            if (b == ']') return pop(t), true;
            f->st = ST_ARR_VALUE;
            if (!push(t, f->n->items)) return false;
            continue; // b starts the first item
        case ST_ARR_AFTER:
            if (b == ']') return pop(t), true;
            if (b != ',') return false;
            f->st = ST_ARR_VALUE;
            return push(t, f->n->items);
        case ST_STR:
            if (b == '"') return pop(t), true;
            if (b == '\\') return f->st = ST_STR_ESC, true;
            return b >= 0x20;
        case ST_STR_ESC:
            if (b == 'u') return f->st = ST_STR_U, f->k = 0, true;
            f->st = ST_STR;
            return strchr("\"\\/bfnrt", b) && b;
        case ST_STR_U:
            if (!is_digit(b) && !((b | 0x20) >= 'a' && (b | 0x20) <= 'f')) return false;
            if (++f->k == 4) f->st = ST_STR;
            return true;
        case ST_SEQ:
            if (f->k == f->n->n_alts) { // every part is done: b belongs to the parent
                pop(t);
                continue;
            }
            if (!push(t, f->n->alts[f->k++])) return false;
            continue;
        case ST_RAW: {
            const struct lit *term = &f->n->lits[0];
            if ((unsigned char)term->s[f->k] == b) {
                f->prop = 0;
                if (++f->k == term->n) pop(t);
                return true;
            }
            if (b == '/' && f->prop) return false; // "</" only in the terminator
            f->k = (unsigned char)term->s[0] == b;
            f->prop = b == '<';
            return true;
        }
        case ST_LIT:
            if (narrow(f->n->lits, f, b, 0)) return true;
            if (!frame_complete(f)) return false;
            pop(t);
            continue; // b belongs to the parent
        case ST_NUM_SIGN:
            f->st = b == '0' ? ST_NUM_ZERO : is_digit(b) ? ST_NUM_INT : ST_START;
            f->k = 1;
            return f->st != ST_START;
        case ST_NUM_FRAC0:
        case ST_NUM_EXPS:
            if (!is_digit(b)) return false;
            f->st = f->st == ST_NUM_FRAC0 ? ST_NUM_FRAC : ST_NUM_EXP;
            f->k = 1;
            return true;
        case ST_NUM_EXP0:
            if (b == '+' || b == '-') return f->st = ST_NUM_EXPS, true;
            if (is_digit(b)) return f->st = ST_NUM_EXP, f->k = 1, true;
            return false;
        default: { // ST_NUM_ZERO, ST_NUM_INT, ST_NUM_FRAC, ST_NUM_EXP: a digit, a part, or the end
            bool real = f->n->kind == K_NUMBER;
            if (is_digit(b) && f->st != ST_NUM_ZERO) { // within the part's bound (above)
                const int max = f->st == ST_NUM_INT    ? NUM_INT_DIGITS
                                : f->st == ST_NUM_FRAC ? NUM_FRAC_DIGITS
                                                       : NUM_EXP_DIGITS;
                return f->k < max && ++f->k;
            }
            if (b == '.' && real && (f->st == ST_NUM_ZERO || f->st == ST_NUM_INT)) return f->st = ST_NUM_FRAC0, true;
            if ((b == 'e' || b == 'E') && real && f->st != ST_NUM_EXP) return f->st = ST_NUM_EXP0, true;
            pop(t);
            continue; // b belongs to the parent
        }
        }
    }
}

bool cstate_feed(struct cstate *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n && s->n; i++) {
        const int n0 = s->n;
        for (int ti = 0; ti < n0; ti++)
            if (!feed_thread(s, ti, (unsigned char)bytes[i])) s->t[ti].dead = true;
        int live = 0;
        for (int ti = 0; ti < s->n; ti++)
            if (!s->t[ti].dead) {
                if (live != ti) thread_copy(&s->t[live], &s->t[ti]);
                live++;
            }
        s->n = live;
    }
    return s->n > 0;
}

bool cstate_done(const struct cstate *s) {
    for (int i = 0; i < s->n; i++) {
        const struct thread *t = &s->t[i];
        int k =
            t->depth; // complete when every open frame may end here (a whole literal, a number, a sequence's last part)
        while (k > 0 && frame_complete(&t->f[k - 1])) k--;
        if (k == 0) return true;
    }
    return false;
}

bool constrain_class_byte(int cls, unsigned char b) {
    if (cls == CONSTRAIN_CLASS_STR) return b >= 0x20 && b != '"' && b != '\\';
    if (cls == CONSTRAIN_CLASS_RAW) return b != '<' && b != '\n';
    return false;
}

// A plain byte of the class leaves every live thread as it is: inside a string (ST_STR takes any
// byte >= 0x20 but the quote and the backslash and stays), or in free text with nothing of the
// terminator or a '<' pending (ST_RAW then only resets k and prop, which are 0 already).
int cstate_fixed_class(const struct cstate *s) {
    int cls = 0;
    for (int i = 0; i < s->n; i++) {
        const struct thread *t = &s->t[i];
        if (t->depth == 0) return 0;
        const struct frame *f = &t->f[t->depth - 1];
        int c = 0;
        if (f->st == ST_STR)
            c = CONSTRAIN_CLASS_STR;
        else if (f->st == ST_RAW && f->k == 0 && f->prop == 0 &&
                 (f->n->lits[0].s[0] == '\n' || f->n->lits[0].s[0] == '<'))
            c = CONSTRAIN_CLASS_RAW;
        if (!c || (cls && c != cls)) return 0;
        cls = c;
    }
    return cls;
}

// ---- distance to a complete document -------------------------------------------------------------

// Bytes a frame still needs (after the value in progress above it, for a parent).
static int frame_left(const struct frame *f) {
    const struct cnode *n = f->n;
    uint64_t left = n->required & ~f->seen;
    switch (f->st) {
    case ST_START:
        return n->minlen;
    case ST_OBJ_OPEN:
        return 1 + props_len(n, left);
    case ST_OBJ_NEXT:
        if (n->any_keys) return 5; // "":0}
        if (left) return props_len(n, left) + 1;
        int shortest = FAR; // after a comma some property must come: the shortest one left
        for (int i = 0; i < n->n_props; i++)
            if (!(f->seen >> n->keys[i].prop & 1)) {
                int l = (int)n->keys[i].n + 1 + n->props[n->keys[i].prop]->minlen;
                shortest = l < shortest ? l : shortest;
            }
        return shortest >= FAR ? FAR : shortest + 1;
    case ST_OBJ_KEY: {
        const struct lit *k = &n->keys[f->lo];
        uint64_t rest = left & ~(1ULL << k->prop);
        return (int)(k->n - f->k) + 1 + n->props[k->prop]->minlen + (rest ? 1 + props_len(n, rest) : 0) + 1;
    }
    case ST_OBJ_KEYG:
        return 3; // :0}
    case ST_OBJ_COLON: {
        if (n->any_keys) return 3;
        uint64_t rest = left & ~(1ULL << f->prop);
        return 1 + n->props[f->prop]->minlen + (rest ? 1 + props_len(n, rest) : 0) + 1;
    }
    case ST_OBJ_VALUE:
    case ST_OBJ_AFTER:
        return (left ? 1 + props_len(n, left) : 0) + 1;
    case ST_ARR_OPEN:
    case ST_ARR_VALUE:
    case ST_ARR_AFTER:
        return 1;
    case ST_STR:
        return 1;
    case ST_STR_ESC:
        return 2;
    case ST_STR_U:
        return 4 - f->k + 1;
    case ST_SEQ: {
        int d = 0;
        for (int i = f->k; i < n->n_alts && d < FAR; i++) d += n->alts[i]->minlen;
        return d;
    }
    case ST_RAW:
        return (int)(n->lits[0].n - f->k);
    case ST_LIT: {
        int m = FAR;
        for (int i = f->lo; i < f->hi; i++) m = (int)n->lits[i].n - f->k < m ? (int)n->lits[i].n - f->k : m;
        return m;
    }
    default:
        return number_complete(f->st) ? 0 : 1;
    }
}

int cstate_distance(const struct cstate *s) {
    int best = FAR;
    for (int i = 0; i < s->n; i++) {
        const struct thread *t = &s->t[i];
        int d = 0;
        for (int k = t->depth - 1; k >= 0 && d < FAR; k--) d += frame_left(&t->f[k]);
        best = d < best ? d : best;
    }
    return best;
}

size_t cstate_forced(const struct cstate *s, char *out, size_t cap) {
    if (s->n != 1 || s->t[0].depth == 0) return 0;
    const struct frame *f = &s->t[0].f[s->t[0].depth - 1];
    const struct lit *l = NULL;
    size_t k = f->k;
    if (f->st == ST_LIT && f->hi - f->lo == 1)
        l = &f->n->lits[f->lo];
    else if (f->st == ST_START && f->n->kind == K_LITS && f->n->n_lits == 1)
        l = &f->n->lits[0], k = 0;
    else if (f->st == ST_RAW && f->k > 0)
        l = &f->n->lits[0]; // inside the terminator: the rest of it
    if (!l || l->n <= k) return 0;
    size_t n = l->n - k < cap ? l->n - k : cap;
    memcpy(out, l->s + k, n);
    return n;
}
