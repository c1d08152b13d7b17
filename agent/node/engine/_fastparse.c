/* The bulk steps of a whole-body read, compiled: inferwatch.agent.node.engine.bulkparse holds their
 * definition in pure Python (the reference, and the path taken when this module is not built) and says what
 * each returns. This file must return exactly what those functions return for every input, or None where they
 * return None; tests/test_bulkparse.py holds the two equal on generated and hostile inputs.
 *
 * scan(text, start, end): the sample lines of text[start:end] of the common shape (bulkparse.PLAIN_LINE) grouped
 *     into families, values parsed as float() parses them; None when a line is of another shape or its value is
 *     no number (or a NaN with a sign).
 * label_sets(texts, known, label, plain_pair): plain label texts split into label sets (see bulkparse).
 * family(blocks, cache): a family's label texts looked up in the reader's cache, in one pass (see bulkparse).
 * canon_ids(keys, canon): label sets' canonical ids, new ones entered in order (see bulkparse).
 * sample_lines(chunk, after_newline): the sample lines that start in a chunk of a body, as the fetch counts them
 *     for engine.max_series (see limits.sample_lines_py).
 *
 * And the engine adapters' bulk steps, whose pure-Python definitions are in seriesmaps.py (held equal by
 * tests/test_seriesmaps.py):
 * memoise(labels, memo, alive, order, skip, same, default, bounds, bound_of): the keys of label tuples not memoised.
 * bucket_tuples(labels, values, memo): a _bucket family as each series' ((bound, count), ...), or None.
 * totals(labels, values, memo): a _sum or _count family as one value per series, or None.
 *
 * Every index is bounded by the string's length; nothing is written outside the objects it creates; any failure
 * of the C API (memory) propagates as a Python exception, never a crash.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline int is_name_start(Py_UCS4 c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

static inline int is_name_char(Py_UCS4 c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

static inline int is_value_char(Py_UCS4 c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '+' ||
           c == '.';
}

/* A family of the chunk: its name's place in the text (the first line's), its objects. */
typedef struct {
    Py_ssize_t at, len;
    PyObject *name, *blocks, *values;
} Family;

static int same_text(int kind, const void *data, Py_ssize_t a, Py_ssize_t b, Py_ssize_t len) {
    if (kind == PyUnicode_1BYTE_KIND) return memcmp((const char *)data + a, (const char *)data + b, len) == 0;
    for (Py_ssize_t k = 0; k < len; k++)
        if (PyUnicode_READ(kind, data, a + k) != PyUnicode_READ(kind, data, b + k)) return 0;
    return 1;
}

/* float(value) as Python parses it, for a text of value characters only (ASCII): 0 and *out, or 1 (no number,
 * or a NaN with a sign: parse_float's rule), or -1 with an exception set (memory). */
/* Powers of ten a double holds exactly (10^0 .. 10^22). */
static const double EXACT_POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The common value, [sign] digits [. digits] with at most 15 significant digits and 22 decimals, read exactly: both
 * the digits (an integer below 2^53) and the power of ten are exact doubles, so their quotient is the correctly
 * rounded value, the one strtod (and float()) gives. 0 and *out; 1: not of that shape (the caller uses strtod). */
static int simple_value(int kind, const void *data, Py_ssize_t at, Py_ssize_t len, double *out) {
    Py_ssize_t k = at, end = at + len;
    int negative = 0;
    Py_UCS4 c = PyUnicode_READ(kind, data, k);
    if (c == '-' || c == '+') {
        negative = c == '-';
        k++;
    }
    int64_t digits = 0;
    int significant = 0, decimals = 0, point = 0, seen = 0;
    for (; k < end; k++) {
        c = PyUnicode_READ(kind, data, k);
        if (c >= '0' && c <= '9') {
            if (digits != 0 || c != '0') significant++;
            if (significant > 15) return 1;
            digits = digits * 10 + (c - '0');
            decimals += point;
            seen = 1;
        } else if (c == '.' && !point) {
            point = 1;
            if (!seen) return 1; /* ".5": strtod's */
        } else {
            return 1;
        }
    }
    if (!seen || decimals > 22 || (point && PyUnicode_READ(kind, data, end - 1) == '.')) return 1;
    double d = (double)digits / EXACT_POW10[decimals];
    *out = negative ? -d : d;
    return 0;
}

static int parse_value(int kind, const void *data, Py_ssize_t at, Py_ssize_t len, double *out) {
    if (simple_value(kind, data, at, len, out) == 0) return 0;
    char small[64];
    char *buf = small;
    if (len >= (Py_ssize_t)sizeof(small)) {
        buf = PyMem_Malloc((size_t)len + 1);
        if (buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (Py_ssize_t k = 0; k < len; k++) buf[k] = (char)PyUnicode_READ(kind, data, at + k);
    buf[len] = '\0';
    char *end = NULL;
    double d = PyOS_string_to_double(buf, &end, NULL);
    int bad = 0;
    if (d == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) {
            if (buf != small) PyMem_Free(buf);
            return -1;
        }
        PyErr_Clear();
        bad = 1;
    } else if (end != buf + len) {
        bad = 1;
    } else if (isnan(d) && (buf[0] == '+' || buf[0] == '-')) {
        bad = 1;
    }
    if (buf != small) PyMem_Free(buf);
    *out = d;
    return bad;
}

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan(text: str, start: int, end: int)");
        return NULL;
    }
    PyObject *text = args[0];
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t start = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t end = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (end == -1 && PyErr_Occurred()) return NULL;
    /* as re's pos and endpos: clamped to the text */
    if (start < 0) start = 0;
    if (end > n) end = n;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    /* as re's "^": a line begins at the text's start or after a newline */
    if (start > 0 && start < end && PyUnicode_READ(kind, data, start - 1) != '\n') Py_RETURN_NONE;

    PyObject *empty = PyUnicode_New(0, 0);
    if (empty == NULL) return NULL;
    Py_ssize_t cap = 8, count = 0, last = -1;
    Family *fams = PyMem_Calloc((size_t)cap, sizeof(Family));
    PyObject *result = NULL;
    if (fams == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t pos = start;
    while (pos < end) {
        Py_ssize_t eol;
        if (kind == PyUnicode_1BYTE_KIND) {
            const char *hit = memchr((const char *)data + pos, '\n', (size_t)(end - pos));
            eol = hit ? hit - (const char *)data : end;
        } else {
            eol = pos;
            while (eol < end && PyUnicode_READ(kind, data, eol) != '\n') eol++;
        }
        Py_ssize_t i = pos;
        if (i >= eol || !is_name_start(PyUnicode_READ(kind, data, i))) goto nomatch;
        i++;
        while (i < eol && is_name_char(PyUnicode_READ(kind, data, i))) i++;
        Py_ssize_t name_end = i;
        if (i >= eol) goto nomatch;
        Py_ssize_t sp = eol - 1; /* the last space of the line: the value holds none */
        while (sp >= i && PyUnicode_READ(kind, data, sp) != ' ') sp--;
        if (sp < i) goto nomatch;
        Py_UCS4 after = PyUnicode_READ(kind, data, i);
        Py_ssize_t lb = 0, le = 0;
        if (after == '{') {
            if (sp - 1 <= i || PyUnicode_READ(kind, data, sp - 1) != '}') goto nomatch;
            lb = i + 1;
            le = sp - 1;
        } else if (after != ' ' || sp != i) {
            goto nomatch;
        }
        Py_ssize_t vlen = eol - (sp + 1);
        if (vlen <= 0) goto nomatch;
        for (Py_ssize_t k = sp + 1; k < eol; k++)
            if (!is_value_char(PyUnicode_READ(kind, data, k))) goto nomatch;
        double value;
        int bad = parse_value(kind, data, sp + 1, vlen, &value);
        if (bad < 0) goto done;
        if (bad) goto nomatch;

        Py_ssize_t nlen = name_end - pos;
        Py_ssize_t f = -1;
        if (last >= 0 && fams[last].len == nlen && same_text(kind, data, fams[last].at, pos, nlen)) {
            f = last;
        } else {
            for (Py_ssize_t k = 0; k < count; k++) {
                if (fams[k].len == nlen && same_text(kind, data, fams[k].at, pos, nlen)) {
                    f = k;
                    break;
                }
            }
        }
        if (f < 0) {
            if (count == cap) {
                Family *grown = PyMem_Realloc(fams, (size_t)cap * 2 * sizeof(Family));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                memset(grown + cap, 0, (size_t)cap * sizeof(Family));
                fams = grown;
                cap *= 2;
            }
            f = count++;
            fams[f].at = pos;
            fams[f].len = nlen;
            fams[f].name = PyUnicode_Substring(text, pos, name_end);
            fams[f].blocks = PyList_New(0);
            fams[f].values = PyList_New(0);
            if (fams[f].name == NULL || fams[f].blocks == NULL || fams[f].values == NULL) goto done;
        }
        last = f;
        PyObject *block;
        if (le > lb) {
            block = PyUnicode_Substring(text, lb, le);
            if (block == NULL) goto done;
        } else {
            block = Py_NewRef(empty);
        }
        int failed = PyList_Append(fams[f].blocks, block);
        Py_DECREF(block);
        if (failed) goto done;
        PyObject *number = PyFloat_FromDouble(value);
        if (number == NULL) goto done;
        failed = PyList_Append(fams[f].values, number);
        Py_DECREF(number);
        if (failed) goto done;
        pos = eol + 1;
        continue;
    nomatch:
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyList_New(count);
    if (result == NULL) goto done;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item = PyTuple_Pack(3, fams[k].name, fams[k].blocks, fams[k].values);
        if (item == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, item);
    }
done:
    if (fams != NULL) {
        for (Py_ssize_t k = 0; k < count; k++) {
            Py_XDECREF(fams[k].name);
            Py_XDECREF(fams[k].blocks);
            Py_XDECREF(fams[k].values);
        }
        PyMem_Free(fams);
    }
    Py_DECREF(empty);
    return result;
}

/* The label set's one form (bulkparse.sorted_labels): the pairs in order, the same object when already so. */
static PyObject *sorted_form(PyObject *labels) {
    Py_ssize_t n = PyTuple_GET_SIZE(labels);
    if (n < 2) return Py_NewRef(labels);
    if (n == 2 || n == 3) {
        int lt = PyObject_RichCompareBool(PyTuple_GET_ITEM(labels, 0), PyTuple_GET_ITEM(labels, 1), Py_LT);
        if (lt < 0) return NULL;
        if (lt && n == 3) {
            lt = PyObject_RichCompareBool(PyTuple_GET_ITEM(labels, 1), PyTuple_GET_ITEM(labels, 2), Py_LT);
            if (lt < 0) return NULL;
        }
        if (lt) return Py_NewRef(labels);
    }
    PyObject *list = PySequence_List(labels);
    if (list == NULL) return NULL;
    if (PyList_Sort(list) < 0) {
        Py_DECREF(list);
        return NULL;
    }
    PyObject *out = PyList_AsTuple(list);
    Py_DECREF(list);
    return out;
}

/* 1: a duplicate label name among the pairs of ``labels``; 0: none; -1: error. */
static int duplicate_name(PyObject *labels) {
    Py_ssize_t n = PyTuple_GET_SIZE(labels);
    for (Py_ssize_t a = 1; a < n; a++) {
        PyObject *name = PyTuple_GET_ITEM(PyTuple_GET_ITEM(labels, a), 0);
        for (Py_ssize_t b = 0; b < a; b++) {
            int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(PyTuple_GET_ITEM(labels, b), 0), name, Py_EQ);
            if (eq != 0) return eq;
        }
    }
    return 0;
}

/* The Pair of one pair text (known, fresh, or plain_pair's answer, then entered in fresh), borrowed; NULL with
 * no exception: not plain. */
static PyObject *pair_of(PyObject *piece, PyObject *known, PyObject *fresh, PyObject *label, PyObject *plain) {
    PyObject *hit = PyDict_GetItemWithError(known, piece);
    if (hit != NULL || PyErr_Occurred()) return hit;
    hit = PyDict_GetItemWithError(fresh, piece);
    if (hit != NULL || PyErr_Occurred()) return hit;
    PyObject *made = PyObject_CallFunctionObjArgs(plain, piece, label, NULL);
    if (made == NULL || made == Py_None) {
        Py_XDECREF(made);
        return NULL;
    }
    int failed = PyDict_SetItem(fresh, piece, made);
    Py_DECREF(made); /* fresh holds it */
    return failed ? NULL : made;
}

/* The (name, value) pair of text[s:j] (a new reference), *is_model set; NULL with no exception: not plain, or a
 * bound that is not a number. */
static PyObject *piece_pair(PyObject *text, Py_ssize_t s, Py_ssize_t j, PyObject *known, PyObject *fresh,
                            PyObject *label, PyObject *plain, int *is_model) {
    PyObject *piece = PyUnicode_Substring(text, s, j);
    if (piece == NULL) return NULL;
    PyObject *hit = pair_of(piece, known, fresh, label, plain);
    Py_DECREF(piece);
    if (hit == NULL) return NULL;
    if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(hit, 0)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(hit, 0)) != 2) {
        PyErr_SetString(PyExc_TypeError, "a pair is ((name, value), flag)");
        return NULL;
    }
    PyObject *flag = PyTuple_GET_ITEM(hit, 1);
    if (flag != Py_None && !(PyUnicode_Check(flag) && PyUnicode_GET_LENGTH(flag) == 0)) return NULL;
    PyObject *pair = PyTuple_GET_ITEM(hit, 0);
    int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(pair, 0), label, Py_EQ);
    if (eq < 0) return NULL;
    *is_model = eq;
    return Py_NewRef(pair);
}

static PyObject *label_sets(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "label_sets(texts: list[str], known: dict, label: str, plain_pair)");
        return NULL;
    }
    PyObject *texts = args[0], *known = args[1], *label = args[2], *plain = args[3];
    Py_ssize_t count = PyList_GET_SIZE(texts);
    PyObject *tuples = PyList_New(count), *keys = PyList_New(count), *models = PyList_New(count);
    PyObject *fresh = PyDict_New(), *result = NULL;
    if (tuples == NULL || keys == NULL || models == NULL || fresh == NULL) goto done;
    /* The pieces of the text before (one-byte texts, the first REUSE of them): a piece equal to the one at the same
     * place there is the same pair (texts of a family differ in a label or two). The pairs are held by its tuple. */
    enum { REUSE = 32 };
    const char *prev = NULL;
    Py_ssize_t prev_start[REUSE], prev_len[REUSE], prev_pieces = 0;
    PyObject *prev_pair[REUSE];
    int prev_model[REUSE];
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *text = PyList_GET_ITEM(texts, t);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "label texts must be str");
            goto done;
        }
        Py_ssize_t n = PyUnicode_GET_LENGTH(text);
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        if (n == 0 || PyUnicode_READ(kind, data, n - 1) != '"') goto none;
        Py_ssize_t pieces = 1;
        for (Py_ssize_t j = 0; j + 1 < n; j++)
            if (PyUnicode_READ(kind, data, j) == '"' && PyUnicode_READ(kind, data, j + 1) == ',') pieces++, j++;
        PyObject *labels = PyTuple_New(pieces);
        if (labels == NULL) goto done;
        PyList_SET_ITEM(tuples, t, labels);
        Py_ssize_t s = 0, k = 0;
        PyObject *model = Py_None;
        for (Py_ssize_t j = 0; k < pieces; j++) {
            int cut = j == n - 1 || (j + 1 < n && PyUnicode_READ(kind, data, j) == '"' &&
                                     PyUnicode_READ(kind, data, j + 1) == ',');
            if (!cut) continue;
            PyObject *pair;
            int is_model;
            if (prev != NULL && kind == PyUnicode_1BYTE_KIND && k < prev_pieces && prev_len[k] == j - s &&
                memcmp(prev + prev_start[k], (const char *)data + s, (size_t)(j - s)) == 0) {
                pair = Py_NewRef(prev_pair[k]);
                is_model = prev_model[k];
            } else {
                pair = piece_pair(text, s, j, known, fresh, label, plain, &is_model);
                if (pair == NULL) {
                    if (PyErr_Occurred()) goto done;
                    goto none;
                }
            }
            PyTuple_SET_ITEM(labels, k, pair);
            if (is_model) model = PyTuple_GET_ITEM(pair, 1);
            if (k < REUSE) { /* this text's piece, for the next */
                prev_pair[k] = pair;
                prev_start[k] = s;
                prev_len[k] = j - s;
                prev_model[k] = is_model;
            }
            k++;
            s = j + 2;
            j++;
        }
        if (kind == PyUnicode_1BYTE_KIND) {
            prev = (const char *)data;
            prev_pieces = pieces < REUSE ? pieces : REUSE;
        } else {
            prev = NULL;
            prev_pieces = 0;
        }
        int dup = duplicate_name(labels);
        if (dup < 0) goto done;
        if (dup) goto none;
        PyList_SET_ITEM(models, t, Py_NewRef(model));
        PyObject *key = sorted_form(labels);
        if (key == NULL) goto done;
        PyList_SET_ITEM(keys, t, key);
    }
    result = PyTuple_Pack(4, tuples, keys, models, fresh);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(tuples);
    Py_XDECREF(keys);
    Py_XDECREF(models);
    Py_XDECREF(fresh);
    return result;
}

/* family(blocks, cache): one pass over a family's label texts, each looked up in the reader's cache of
 * (labels, bad bound, canonical id, model) entries (see bulkparse.family). */
static PyObject *family(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "family(blocks: list[str], cache: dict)");
        return NULL;
    }
    PyObject *blocks = args[0], *cache = args[1];
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    PyObject *labels = PyList_New(n), *ids = PySet_New(NULL), *models = PySet_New(NULL), *bads = PySet_New(NULL);
    PyObject *result = NULL;
    if (labels == NULL || ids == NULL || models == NULL || bads == NULL) goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *info = PyDict_GetItemWithError(cache, PyList_GET_ITEM(blocks, k));
        if (info == NULL) {
            if (!PyErr_Occurred()) result = Py_NewRef(Py_None);
            goto done;
        }
        if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 4) {
            PyErr_SetString(PyExc_TypeError, "a cache entry is (labels, bad bound, canonical id, model)");
            goto done;
        }
        PyList_SET_ITEM(labels, k, Py_NewRef(PyTuple_GET_ITEM(info, 0)));
        if (PySet_Add(bads, PyTuple_GET_ITEM(info, 1)) < 0 || PySet_Add(ids, PyTuple_GET_ITEM(info, 2)) < 0 ||
            PySet_Add(models, PyTuple_GET_ITEM(info, 3)) < 0)
            goto done;
    }
    result = PyTuple_Pack(4, labels, ids, models, bads);
done:
    Py_XDECREF(labels);
    Py_XDECREF(ids);
    Py_XDECREF(models);
    Py_XDECREF(bads);
    return result;
}

/* canon_ids(keys, canon): each key's id in canon, a key new to it entered with the next id (see bulkparse). */
static PyObject *canon_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "canon_ids(keys: list, canon: dict)");
        return NULL;
    }
    PyObject *keys = args[0], *canon = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *ids = PyList_New(n);
    if (ids == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *next = PyLong_FromSsize_t(PyDict_GET_SIZE(canon));
        if (next == NULL) goto fail;
        PyObject *id = PyDict_SetDefault(canon, PyList_GET_ITEM(keys, k), next); /* borrowed */
        Py_DECREF(next);
        if (id == NULL) goto fail;
        PyList_SET_ITEM(ids, k, Py_NewRef(id));
    }
    return ids;
fail:
    Py_DECREF(ids);
    return NULL;
}

/* --- the engine adapters' bulk steps (seriesmaps.py) --------------------------------------------------------- */

/* seriesmaps.split_one of one label tuple: its pieces (borrowed: *model NULL for none, *le Py_None for none) and the
 * other labels sorted (a new tuple); 0, or -1 with an exception set. */
static int split_pieces(PyObject *labels, PyObject *order, PyObject *skip, PyObject **model, PyObject **le,
                        PyObject **others) {
    static PyObject *le_name = NULL;
    if (le_name == NULL && (le_name = PyUnicode_InternFromString("le")) == NULL) return -1;
    if (!PyTuple_Check(labels)) {
        PyErr_SetString(PyExc_TypeError, "a label set is a tuple of (name, value) pairs");
        return -1;
    }
    Py_ssize_t norder = PyTuple_GET_SIZE(order), rank = norder;
    *model = NULL, *le = Py_None;
    PyObject *rest = PyList_New(0);
    if (rest == NULL) return -1;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(labels); j++) {
        PyObject *pair = PyTuple_GET_ITEM(labels, j);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "a label is a (name, value) tuple");
            goto fail;
        }
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        int eq = PyObject_RichCompareBool(name, le_name, Py_EQ);
        if (eq < 0) goto fail;
        if (eq) {
            *le = PyTuple_GET_ITEM(pair, 1);
            continue;
        }
        Py_ssize_t at = -1;
        for (Py_ssize_t r = 0; r < norder && at < 0; r++) {
            eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(order, r), name, Py_EQ);
            if (eq < 0) goto fail;
            if (eq) at = r;
        }
        if (at >= 0) {
            if (at < rank) {
                *model = PyTuple_GET_ITEM(pair, 1);
                rank = at;
            }
            continue;
        }
        int skipped = PySet_Contains(skip, name);
        if (skipped < 0 || (!skipped && PyList_Append(rest, pair) < 0)) goto fail;
    }
    if (PyList_GET_SIZE(rest) > 1 && PyList_Sort(rest) < 0) goto fail;
    *others = PyList_AsTuple(rest);
    Py_DECREF(rest);
    return *others == NULL ? -1 : 0;
fail:
    Py_DECREF(rest);
    return -1;
}

/* memoise(labels, memo, alive, order, skip, same, default, bounds, bound_of): see seriesmaps.memoise. */
static PyObject *memoise(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[2]) ||
        !PyTuple_Check(args[3]) || !PyAnySet_Check(args[4]) || !PyDict_Check(args[5]) || !PyDict_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "memoise(labels: list, memo: dict, alive: list, order: tuple, "
                                         "skip: frozenset, same: dict, default, bounds: dict, bound_of)");
        return NULL;
    }
    PyObject *all = args[0], *memo = args[1], *alive = args[2], *order = args[3], *skip = args[4], *same = args[5];
    PyObject *fallback = args[6], *bounds = args[7], *bound_of = args[8], *id = NULL, *bound = NULL;
    Py_ssize_t entered = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all); i++) {
        PyObject *labels = PyList_GET_ITEM(all, i);
        if ((id = PyLong_FromVoidPtr(labels)) == NULL) goto fail;
        int known = PyDict_Contains(memo, id);
        if (known != 0) {
            Py_CLEAR(id);
            if (known < 0) goto fail;
            continue;
        }
        PyObject *model, *le, *others;
        if (split_pieces(labels, order, skip, &model, &le, &others) < 0) goto fail;
        PyObject *who = fallback, *kept = NULL; /* borrowed; the model interned first, as split_one does */
        if (model == NULL || (who = PyDict_SetDefault(same, model, model)) != NULL)
            kept = PyDict_SetDefault(same, others, others);
        Py_DECREF(others);
        if (kept == NULL) goto fail;
        if (le == Py_None) {
            bound = Py_NewRef(Py_None);
        } else if ((bound = Py_XNewRef(PyDict_GetItemWithError(bounds, le))) == NULL) {
            if (PyErr_Occurred()) goto fail;
            Py_INCREF(le); /* the call may drop what holds it */
            bound = PyObject_CallOneArg(bound_of, le);
            Py_DECREF(le);
            if (bound == NULL) goto fail;
            if (bound == Py_None) { /* no number: left out */
                Py_CLEAR(bound);
                Py_CLEAR(id);
                continue;
            }
        }
        PyObject *key = PyTuple_Pack(3, who, kept, bound);
        Py_CLEAR(bound);
        if (key == NULL) goto fail;
        int set = PyDict_SetItem(memo, id, key);
        Py_DECREF(key);
        Py_CLEAR(id);
        if (set < 0 || PyList_Append(alive, labels) < 0) goto fail;
        entered++;
    }
    return PyLong_FromSsize_t(entered);
fail:
    Py_XDECREF(id);
    Py_XDECREF(bound);
    return NULL;
}

/* The doubles of a family's values (a buffer of format "d", as array("d")), as many as its label tuples: 0; -1 with
 * an exception set. */
static int family_values(PyObject *labels, PyObject *values, Py_buffer *view) {
    if (!PyList_Check(labels)) {
        PyErr_SetString(PyExc_TypeError, "a family's label tuples are a list");
        return -1;
    }
    if (PyObject_GetBuffer(values, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->format == NULL || strcmp(view->format, "d") != 0 || view->itemsize != sizeof(double)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "a family's values are an array of doubles");
        return -1;
    }
    if (view->len / view->itemsize != PyList_GET_SIZE(labels)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "a family's label tuples and values differ in length");
        return -1;
    }
    return 0;
}

/* seriesmaps._plain: no value below zero, none a negative zero, the first no NaN. */
static int plain_values(const double *v, Py_ssize_t n) {
    if (n > 0 && isnan(v[0])) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] < 0 || (v[i] == 0 && signbit(v[i]))) return 0;
    return 1;
}

/* The key memoised for a label tuple (borrowed), Py_None where there is none or it is None; NULL: an error. */
static PyObject *memoised(PyObject *memo, PyObject *labels) {
    PyObject *id = PyLong_FromVoidPtr(labels);
    if (id == NULL) return NULL;
    PyObject *key = PyDict_GetItemWithError(memo, id);
    Py_DECREF(id);
    if (key == NULL) return PyErr_Occurred() ? NULL : Py_None;
    if (key != Py_None && (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 3)) {
        PyErr_SetString(PyExc_TypeError, "a memo entry is (model, labels, bound) or None");
        return NULL;
    }
    return key;
}

/* totals(labels, values, memo): one value per series, or None (see seriesmaps.totals). */
static PyObject *totals_of(PyObject *labels, const double *v, PyObject *memo) {
    PyObject *result = NULL, *out = PyDict_New();
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(labels); i++) {
        PyObject *key = memoised(memo, PyList_GET_ITEM(labels, i));
        if (key == NULL) goto done;
        if (key == Py_None) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *series = PyTuple_GetSlice(key, 0, 2);
        if (series == NULL) goto done;
        int seen = PyDict_Contains(out, series);
        if (seen == 0) {
            PyObject *value = PyFloat_FromDouble(v[i]);
            if (value == NULL || PyDict_SetItem(out, series, value) < 0) seen = -1;
            Py_XDECREF(value);
        }
        Py_DECREF(series);
        if (seen < 0) goto done;
        if (seen > 0) {
            result = Py_NewRef(Py_None); /* a series twice */
            goto done;
        }
    }
    result = Py_NewRef(out);
done:
    Py_DECREF(out);
    return result;
}

/* One series' buckets, ended: the tuple of its pairs entered in out when its last bound is +Inf; 0, -1 error. */
static int end_series(PyObject *out, PyObject *series, PyObject *pairs, double last) {
    if (series == NULL || !(isinf(last) && last > 0)) return 0;
    PyObject *buckets = PyList_AsTuple(pairs);
    if (buckets == NULL) return -1;
    int set = PyDict_SetItem(out, series, buckets);
    Py_DECREF(buckets);
    return set;
}

/* bucket_tuples(labels, values, memo): each series' ((bound, count), ...), or None (see seriesmaps.bucket_tuples). */
static PyObject *buckets_of(PyObject *labels, const double *v, PyObject *memo) {
    PyObject *result = NULL;
    PyObject *out = PyDict_New(), *seen = PySet_New(NULL), *pairs = NULL, *series = NULL;
    double last = 0;
    if (out == NULL || seen == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(labels); i++) {
        PyObject *key = memoised(memo, PyList_GET_ITEM(labels, i));
        if (key == NULL) goto done;
        if (key == Py_None || !PyFloat_CheckExact(PyTuple_GET_ITEM(key, 2))) {
            result = Py_NewRef(Py_None); /* not memoised, left out, or a bucket without a bound */
            goto done;
        }
        PyObject *bound = PyTuple_GET_ITEM(key, 2);
        int same = 0;
        if (series != NULL) {
            same = PyObject_RichCompareBool(PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(series, 0), Py_EQ);
            if (same > 0) same = PyObject_RichCompareBool(PyTuple_GET_ITEM(key, 1), PyTuple_GET_ITEM(series, 1), Py_EQ);
            if (same < 0) goto done;
        }
        if (!same) {
            if (end_series(out, series, pairs, last) < 0) goto done;
            Py_CLEAR(series);
            Py_CLEAR(pairs);
            if ((series = PyTuple_GetSlice(key, 0, 2)) == NULL) goto done;
            int twice = PySet_Contains(seen, series);
            if (twice != 0) {
                if (twice > 0) result = Py_NewRef(Py_None); /* the series' samples apart */
                goto done;
            }
            if (PySet_Add(seen, series) < 0 || (pairs = PyList_New(0)) == NULL) goto done;
        } else if (!(last < PyFloat_AS_DOUBLE(bound))) {
            result = Py_NewRef(Py_None); /* bounds not in ascending order, or one twice */
            goto done;
        }
        last = PyFloat_AS_DOUBLE(bound);
        PyObject *count = PyFloat_FromDouble(v[i]);
        if (count == NULL) goto done;
        PyObject *pair = PyTuple_Pack(2, bound, count);
        Py_DECREF(count);
        if (pair == NULL) goto done;
        int added = PyList_Append(pairs, pair);
        Py_DECREF(pair);
        if (added < 0) goto done;
    }
    if (end_series(out, series, pairs, last) < 0) goto done;
    result = Py_NewRef(out);
done:
    Py_XDECREF(out);
    Py_XDECREF(seen);
    Py_XDECREF(pairs);
    Py_XDECREF(series);
    return result;
}

/* A step over a family (args: labels, values, memo): None where its values are not plain. */
static PyObject *family_step(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                             PyObject *(*step)(PyObject *, const double *, PyObject *)) {
    if (nargs != 3 || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_buffer view;
    if (family_values(args[0], args[1], &view) < 0) return NULL;
    const double *v = (const double *)view.buf;
    PyObject *result = plain_values(v, PyList_GET_SIZE(args[0])) ? step(args[0], v, args[2]) : Py_NewRef(Py_None);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *totals(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return family_step(args, nargs, "totals(labels: list, values: array, memo: dict)", totals_of);
}

static PyObject *bucket_tuples(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return family_step(args, nargs, "bucket_tuples(labels: list, values: array, memo: dict)", buckets_of);
}

/* sample_lines(chunk, after_newline): one pass over the chunk's newlines (memchr) for what limits.sample_lines_py
 * counts with four searches: its line starts, less those of a comment ("\n#") or an empty line ("\n\n", counted
 * without overlap as bytes.count counts it), the chunk's first byte too when the byte before it was a newline. */
static PyObject *sample_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sample_lines(chunk: bytes, after_newline: bool)");
        return NULL;
    }
    int after = PyObject_IsTrue(args[1]);
    if (after < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *b = (const char *)view.buf;
    Py_ssize_t n = view.len, count = 0;
    if (n > 0) {
        Py_ssize_t newlines = 0, skipped = 0, free_from = 0; /* a "\n\n" starts at free_from or later */
        const char *p = b, *end = b + n;
        while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
            Py_ssize_t i = p - b;
            newlines++;
            if (i + 1 < n) {
                if (b[i + 1] == '#') {
                    skipped++;
                } else if (b[i + 1] == '\n' && i >= free_from) {
                    skipped++;
                    free_from = i + 2;
                }
            }
            p++;
        }
        count = newlines + after - (b[n - 1] == '\n') - skipped;
        if (after && (b[0] == '#' || b[0] == '\n')) count--;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(text, start, end): the sample lines of text[start:end] as families (see bulkparse.scan)."},
    {"label_sets", (PyCFunction)(void (*)(void))label_sets, METH_FASTCALL,
     "label_sets(texts, known, label, plain_pair): plain label texts as label sets (see bulkparse.label_sets)."},
    {"family", (PyCFunction)(void (*)(void))family, METH_FASTCALL,
     "family(blocks, cache): a family's cached label sets, ids, models and bad bounds (see bulkparse.family)."},
    {"canon_ids", (PyCFunction)(void (*)(void))canon_ids, METH_FASTCALL,
     "canon_ids(keys, canon): each label set's canonical id, new ones entered (see bulkparse.canon_ids)."},
    {"memoise", (PyCFunction)(void (*)(void))memoise, METH_FASTCALL,
     "memoise(labels, memo, alive, order, skip, same, default, bounds, bound_of): the keys of new label tuples "
     "memoised, how many returned (see seriesmaps.memoise)."},
    {"bucket_tuples", (PyCFunction)(void (*)(void))bucket_tuples, METH_FASTCALL,
     "bucket_tuples(labels, values, memo): a _bucket family per series, or None (see seriesmaps.bucket_tuples)."},
    {"totals", (PyCFunction)(void (*)(void))totals, METH_FASTCALL,
     "totals(labels, values, memo): a _sum or _count family per series, or None (see seriesmaps.totals)."},
    {"sample_lines", (PyCFunction)(void (*)(void))sample_lines, METH_FASTCALL,
     "sample_lines(chunk, after_newline): the sample lines that start in chunk (see limits.sample_lines_py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastparse",
    "Compiled bulk steps of the exposition reader and the engine adapters (see bulkparse.py, seriesmaps.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__fastparse(void) { return PyModule_Create(&module); }
