/* flashcore._fastcall: the host path of a repeated flashcore.attention call
 * on torch tensors, compiled (issue 18: a call's host time within 10 us).
 *
 * Optional. The package works without it (flashcore/_launch.py's
 * launch_plain does the same in Python, from the plans of
 * flashcore/_planning.py); where it is built (the wheel, or a CMake build
 * with Python's headers) that Python path registers each plan it serves
 * here, and the next call with the same shapes, strides, dtypes, devices
 * and options is served by call() below without running any Python: the
 * tensors' metadata is read and compared in C, the params struct is the
 * plan's template with the new addresses, and flashcore_forward is called
 * through the pointer the ctypes binding found.
 * What can change from call to call is still checked where the Python path
 * checks it: the addresses by flashcore_forward itself (it validates every
 * call), grad mode and requires_grad here (a call to be differentiated,
 * or detached, goes back to Python).
 *
 * No torch headers and no link to torch or libflashcore: torch is reached
 * through the Python objects the package passes to configure(), the
 * library through a function pointer. Written against Python's limited API
 * (3.8), so one build serves every CPython 3 from 3.8 on (abi3).
 *
 * call() returns None for any call it does not serve (a miss): the caller
 * then takes the Python path, which registers the call's plan (remember())
 * once it has served it from its own cache.
 *
 * The backward pass (issue 58: a training step's host time) is served the
 * same way: backward() takes flashcore::backward's arguments (the saved
 * tensors of the forward, dout and the options), matches them against the
 * plans remember_backward() was given by flashcore/_backward.py, and calls
 * flashcore_backward with dq, dk, dv (torch.empty_like of q, k and v; dsinks
 * of sinks where the call asks for it) and a workspace from torch.empty, all
 * torch's caching allocator's. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "flashcore.h"

/* Plans kept, replaced round robin: enough for a model's few shapes
 * (prefill and decode of each layer kind); more only cost the Python path. */
#define FASTCALL_MAX_PLANS 16
/* Tensors of more dimensions are never served here. */
#define FASTCALL_MAX_DIMS 8
/* The arrays a plan describes, in the order call() takes them: the descale
 * factors of quantized (fp8) inputs, in the order of their fields, then the
 * learnable sinks. */
enum {
    ARRAY_Q,
    ARRAY_K,
    ARRAY_V,
    ARRAY_OUT,
    ARRAY_SEQUSED_K,
    ARRAY_Q_DESCALE,
    ARRAY_K_DESCALE,
    ARRAY_V_DESCALE,
    ARRAY_SINKS,
    NUM_ARRAYS
};
#define NUM_DESCALES 3
/* The arguments of call() (those of remember() that begin it). */
#define CALL_ARGS (NUM_ARRAYS + 3)

typedef flashcore_status (*forward_fn)(flashcore_handle, const flashcore_forward_params *, void *, size_t, void *);
typedef flashcore_status (*backward_fn)(flashcore_handle, const flashcore_backward_params *, void *, size_t, void *);

/* What a plan matches of one array: everything of it but its address. */
typedef struct {
    int present;
    int ndim;
    long long sizes[FASTCALL_MAX_DIMS];
    long long strides[FASTCALL_MAX_DIMS];
    PyObject *dtype; /* a strong reference in a plan, borrowed in a probe */
    long device;
} ArrayMeta;

/* The options a plan matches (those of the key, _planning.py plan_of, that the
 * plan was kept under), as read_options() reads them. */
typedef struct {
    PyObject *layout; /* str; a strong reference in a plan */
    int causal;
    int has_scale;
    double softmax_scale;
    int has_num_splits;
    long num_splits;
    int has_window;
    long window_left, window_right;
    double softcap;
    long attention_chunk;
    long sm_margin; /* it changes the plan (the split count, the persistent grid), so it is matched */
    int return_lse;
} CallOptions;

typedef struct {
    int valid;
    CallOptions options;
    ArrayMeta arrays[NUM_ARRAYS];
    flashcore_forward_params template_params;
    int out_like_q;
    PyObject *out_args, *out_kwargs; /* torch.empty's arguments for out, where out_like_q is 0 */
    PyObject *lse_args, *lse_kwargs; /* and for lse, or NULL where the call returns none */
    size_t workspace_bytes;
    PyObject *handle;         /* the Python Handle, kept alive while the plan is */
    flashcore_handle raw_handle;
    PyObject *device_args;    /* (device,): the current-stream query's argument */
    long device;
} Plan;

/* configure()'s objects: torch's and the binding's. */
static struct {
    int configured;
    forward_fn forward;
    PyObject *check;           /* Library.check(status): raises the status's error */
    PyObject *tensor_type;     /* torch.Tensor (exact type only: subclasses take the Python path) */
    PyObject *parameter_type;  /* but torch.nn.Parameter (or None), read as a tensor: see is_plain_tensor() */
    PyObject *is_grad_enabled; /* torch.is_grad_enabled */
    PyObject *empty;           /* torch.empty */
    PyObject *empty_like;      /* torch.empty_like */
    PyObject *current_stream;  /* (device) -> cudaStream_t as an int */
    PyObject *capturing;       /* () -> whether the current stream is being captured */
    PyObject *kept_workspaces; /* dict (device, stream) -> (tensor, bytes, address) */
    PyObject *stride;          /* torch.Tensor.stride, called unbound */
    PyObject *get_device;      /* torch.Tensor.get_device */
    PyObject *data_ptr;        /* torch.Tensor.data_ptr */
    /* configure_backward()'s: flashcore_backward, and
     * torch.are_deterministic_algorithms_enabled (or'ed into a call's own
     * deterministic flag, as flashcore::backward's Python path does). */
    backward_fn backward;
    PyObject *deterministic_enabled;
    PyObject *uint8; /* torch.uint8: the backward workspace's dtype */
} torch_api;

static Plan plans[FASTCALL_MAX_PLANS];
static unsigned next_victim;

static PyObject *str_shape, *str_dtype, *str_requires_grad;

/* Whether this path reads `a`: a torch.Tensor, or an nn.Parameter (a
 * model's learnable sinks are one), which overrides nothing read here.
 * Other subclasses (which may) take the Python path. */
static int is_plain_tensor(PyObject *a) {
    PyObject *type = (PyObject *)Py_TYPE(a);
    return type == torch_api.tensor_type || type == torch_api.parameter_type;
}

/* ---- reading a call ---------------------------------------------------- */

/* Reads `array`'s metadata into *meta (dtype borrowed). Returns 1 when read,
 * 0 when this path does not serve it, -1 with an exception set. */
static int read_meta(PyObject *array, ArrayMeta *meta) {
    meta->present = 1;
    PyObject *shape = PyObject_GetAttr(array, str_shape);
    if (shape == NULL) return -1;
    Py_ssize_t ndim = PyTuple_Size(shape);
    if (ndim < 0 || ndim > FASTCALL_MAX_DIMS) {
        Py_DECREF(shape);
        PyErr_Clear();
        return 0;
    }
    meta->ndim = (int)ndim;
    for (Py_ssize_t i = 0; i < ndim; ++i) meta->sizes[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    Py_DECREF(shape);
    PyObject *strides = PyObject_CallFunctionObjArgs(torch_api.stride, array, NULL);
    if (strides == NULL) return -1;
    if (PyTuple_Size(strides) != ndim) {
        Py_DECREF(strides);
        PyErr_Clear();
        return 0;
    }
    for (Py_ssize_t i = 0; i < ndim; ++i) meta->strides[i] = PyLong_AsLongLong(PyTuple_GetItem(strides, i));
    Py_DECREF(strides);
    PyObject *dtype = PyObject_GetAttr(array, str_dtype);
    if (dtype == NULL) return -1;
    /* torch's dtypes live as long as torch: comparing the address after
     * dropping the reference is safe, and a plan holds its own. */
    meta->dtype = dtype;
    Py_DECREF(dtype);
    PyObject *device = PyObject_CallFunctionObjArgs(torch_api.get_device, array, NULL);
    if (device == NULL) return -1;
    meta->device = PyLong_AsLong(device);
    Py_DECREF(device);
    return PyErr_Occurred() ? -1 : 1;
}

static int same_meta(const ArrayMeta *a, const ArrayMeta *b) {
    if (a->present != b->present) return 0;
    if (!a->present) return 1;
    size_t dims = (size_t)a->ndim * sizeof(long long);
    return a->ndim == b->ndim && a->dtype == b->dtype && a->device == b->device &&
           memcmp(a->sizes, b->sizes, dims) == 0 && memcmp(a->strides, b->strides, dims) == 0;
}

/* Reads an exact int (a bool, equal to 0 or 1, may mean something else to
 * the full path) into *value: 1, or 0 (not served). */
static int read_int(PyObject *object, long *value) {
    if (!PyLong_CheckExact(object)) return 0;
    *value = PyLong_AsLong(object);
    if (*value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Reads options (causal, softmax_scale, num_splits, window, softcap,
 * attention_chunk, sm_margin) with plan_of's rules (exact types: a value of
 * another type that compares equal may mean something else to the full
 * path), narrower: a float softmax_scale and softcap only. Returns 1, 0 (not
 * served) or -1. */
static int read_options(PyObject *layout, PyObject *options, PyObject *return_lse, CallOptions *o) {
    if (!PyUnicode_CheckExact(layout) || !PyTuple_CheckExact(options) || PyTuple_Size(options) != 7) return 0;
    PyObject *causal = PyTuple_GetItem(options, 0), *scale = PyTuple_GetItem(options, 1),
             *num_splits = PyTuple_GetItem(options, 2), *window = PyTuple_GetItem(options, 3),
             *softcap = PyTuple_GetItem(options, 4), *attention_chunk = PyTuple_GetItem(options, 5),
             *sm_margin = PyTuple_GetItem(options, 6);
    o->layout = layout;
    int truth = PyObject_IsTrue(causal);
    if (truth < 0) return -1;
    o->causal = truth;
    o->has_scale = scale != Py_None;
    o->softmax_scale = 0.0;
    if (o->has_scale) {
        if (!PyFloat_CheckExact(scale)) return 0;
        o->softmax_scale = PyFloat_AsDouble(scale);
        /* Only a scale that is > 0 as a float32 is served, whatever plan is
         * kept: the Python path refuses 0 (-0.0 compares equal to it here),
         * a nonzero scale that rounds to 0 (1e-50; -1e-50 to -0.0) and one
         * beyond a float32, and leaves the rest to the library. */
        double d = o->softmax_scale;
        if (!(d > 0.0 && d <= FLT_MAX && (float)d > 0.0f)) return 0;
    }
    o->has_num_splits = num_splits != Py_None;
    o->num_splits = 0;
    if (o->has_num_splits) {
        if (!PyLong_CheckExact(num_splits)) return 0;
        o->num_splits = PyLong_AsLong(num_splits);
        if (o->num_splits == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    o->has_window = window != Py_None;
    o->window_left = o->window_right = 0;
    if (o->has_window) {
        if (!PyTuple_CheckExact(window) || PyTuple_Size(window) != 2) return 0;
        PyObject *left = PyTuple_GetItem(window, 0), *right = PyTuple_GetItem(window, 1);
        if (!PyLong_CheckExact(left) || !PyLong_CheckExact(right)) return 0;
        o->window_left = PyLong_AsLong(left);
        o->window_right = PyLong_AsLong(right);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    if (!PyFloat_CheckExact(softcap)) return 0;
    o->softcap = PyFloat_AsDouble(softcap);
    if (!read_int(attention_chunk, &o->attention_chunk) || !read_int(sm_margin, &o->sm_margin)) return 0;
    truth = PyObject_IsTrue(return_lse);
    if (truth < 0) return -1;
    o->return_lse = truth;
    return 1;
}

static int same_options(const CallOptions *a, const CallOptions *b) {
    if (a->causal != b->causal || a->has_scale != b->has_scale || a->has_num_splits != b->has_num_splits ||
        a->has_window != b->has_window || a->return_lse != b->return_lse || a->softcap != b->softcap ||
        a->attention_chunk != b->attention_chunk || a->sm_margin != b->sm_margin)
        return 0;
    if (a->has_scale && a->softmax_scale != b->softmax_scale) return 0;
    if (a->has_num_splits && a->num_splits != b->num_splits) return 0;
    if (a->has_window && (a->window_left != b->window_left || a->window_right != b->window_right)) return 0;
    if (a->layout == b->layout) return 1;
    return PyUnicode_Compare(a->layout, b->layout) == 0 && !PyErr_Occurred();
}

/* A call's arrays and options, as call() and remember() take them. */
typedef struct {
    PyObject *arrays[NUM_ARRAYS];
    PyObject *layout, *options, *return_lse;
    ArrayMeta meta[NUM_ARRAYS];
    CallOptions call_options;
} Probe;

/* Unpacks (q, k, v, out, seqused_k, q_descale, k_descale, v_descale, sinks,
 * layout, options, return_lse) and reads them. Returns 1 when this path may
 * serve the call, 0 or -1 as above. */
static int probe_call(PyObject *args, Probe *p) {
    if (!PyArg_UnpackTuple(args, "call", CALL_ARGS, CALL_ARGS, &p->arrays[ARRAY_Q], &p->arrays[ARRAY_K],
                           &p->arrays[ARRAY_V], &p->arrays[ARRAY_OUT], &p->arrays[ARRAY_SEQUSED_K],
                           &p->arrays[ARRAY_Q_DESCALE], &p->arrays[ARRAY_K_DESCALE], &p->arrays[ARRAY_V_DESCALE],
                           &p->arrays[ARRAY_SINKS], &p->layout, &p->options, &p->return_lse))
        return -1;
    if (!torch_api.configured) return 0;
    for (int i = 0; i < NUM_ARRAYS; ++i) {
        PyObject *a = p->arrays[i];
        if (a == Py_None && i >= ARRAY_OUT) continue;
        if (!is_plain_tensor(a)) return 0;
    }
    int read = read_options(p->layout, p->options, p->return_lse, &p->call_options);
    if (read <= 0) return read;
    /* A plan serves calls without grad only: where grad mode is on and an
     * input requires grad (q, k, v, or sinks, a model's parameter), the
     * Python path makes the call differentiable (or detaches). */
    PyObject *grad = PyObject_CallObject(torch_api.is_grad_enabled, NULL);
    if (grad == NULL) return -1;
    int grad_enabled = PyObject_IsTrue(grad);
    Py_DECREF(grad);
    if (grad_enabled < 0) return -1;
    if (grad_enabled) {
        static const int differentiable[] = {ARRAY_Q, ARRAY_K, ARRAY_V, ARRAY_SINKS};
        for (size_t d = 0; d < sizeof differentiable / sizeof differentiable[0]; ++d) {
            int i = differentiable[d];
            if (p->arrays[i] == Py_None) continue;
            PyObject *requires = PyObject_GetAttr(p->arrays[i], str_requires_grad);
            if (requires == NULL) return -1;
            int truth = PyObject_IsTrue(requires);
            Py_DECREF(requires);
            if (truth != 0) return truth < 0 ? -1 : 0;
        }
    }
    for (int i = 0; i < NUM_ARRAYS; ++i) {
        if (p->arrays[i] == Py_None) {
            p->meta[i].present = 0;
            continue;
        }
        read = read_meta(p->arrays[i], &p->meta[i]);
        if (read <= 0) return read;
    }
    return 1;
}

static Plan *find_plan(const Probe *p) {
    for (int i = 0; i < FASTCALL_MAX_PLANS; ++i) {
        Plan *plan = &plans[i];
        if (!plan->valid || !same_options(&plan->options, &p->call_options)) continue;
        int same = 1;
        for (int a = 0; a < NUM_ARRAYS && same; ++a) same = same_meta(&plan->arrays[a], &p->meta[a]);
        if (same) return plan;
    }
    return NULL;
}

/* The address of a torch tensor (data_ptr()) in *address: 0, or -1 with an
 * exception set. */
static int address_of(PyObject *tensor, const void **address) {
    PyObject *ptr = PyObject_CallFunctionObjArgs(torch_api.data_ptr, tensor, NULL);
    if (ptr == NULL) return -1;
    *address = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

/* The kept workspace of (device, stream) when it holds the plan's
 * workspace_bytes and may be used (the stream is not being captured): its
 * address in *address. Returns 1 when found, 0 when the Python path must
 * provide one, -1. */
static int kept_workspace(const Plan *plan, void *stream, void **address) {
    PyObject *key = Py_BuildValue("(lN)", plan->device, PyLong_FromVoidPtr(stream));
    if (key == NULL) return -1;
    PyObject *kept = PyDict_GetItem(torch_api.kept_workspaces, key); /* borrowed */
    Py_DECREF(key);
    if (kept == NULL || !PyTuple_Check(kept) || PyTuple_Size(kept) != 3) return 0;
    size_t kept_bytes = PyLong_AsSize_t(PyTuple_GetItem(kept, 1));
    if (kept_bytes == (size_t)-1 && PyErr_Occurred()) return -1;
    if (kept_bytes < plan->workspace_bytes) return 0;
    PyObject *capturing = PyObject_CallObject(torch_api.capturing, NULL);
    if (capturing == NULL) return -1;
    int truth = PyObject_IsTrue(capturing);
    Py_DECREF(capturing);
    if (truth != 0) return truth < 0 ? -1 : 0;
    *address = PyLong_AsVoidPtr(PyTuple_GetItem(kept, 2));
    return PyErr_Occurred() ? -1 : 1;
}

/* ---- the module's functions -------------------------------------------- */

/* Stubs with flashcore_forward's and flashcore_backward's signatures that
 * queue nothing and return success: configure()'d in their place, the
 * binding's own host time per call can be measured
 * (bench/python_overhead.py) and call() and backward() tested on a machine
 * without a GPU. */
#define FASTCALL_STUB(name, params_type)                                                                     \
    static flashcore_status name(flashcore_handle handle, const params_type *params, void *workspace,        \
                                 size_t workspace_bytes, void *stream) {                                     \
        (void)handle, (void)params, (void)workspace, (void)workspace_bytes, (void)stream;                    \
        return FLASHCORE_STATUS_SUCCESS;                                                                     \
    }
FASTCALL_STUB(stub_forward, flashcore_forward_params)
FASTCALL_STUB(stub_backward, flashcore_backward_params)

/* Sets the exception of a call that returned `status`: the binding's error
 * (its check raises), else a RuntimeError naming `function`. */
static void raise_status(flashcore_status status, const char *function) {
    PyObject *checked = PyObject_CallFunction(torch_api.check, "i", (int)status);
    if (checked == NULL) return;
    Py_DECREF(checked);
    PyErr_Format(PyExc_RuntimeError, "%s failed with status %d", function, (int)status);
}

PyDoc_STRVAR(stub_forward_address_doc,
             "stub_forward_address()\n\n"
             "The address of a function with flashcore_forward's signature that returns success and queues "
             "nothing, for configure() in benchmarks and tests.");

static PyObject *fastcall_stub_forward_address(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromVoidPtr((void *)stub_forward);
}

PyDoc_STRVAR(call_doc,
             "call(q, k, v, out, seqused_k, q_descale, k_descale, v_descale, sinks, layout, options, return_lse)\n\n"
             "Queues a call a remembered plan serves and returns its result (out, or (out, lse)); None where no "
             "plan serves it (the caller then takes the Python path). options: (causal, softmax_scale, num_splits, "
             "window, softcap, attention_chunk, sm_margin), as flashcore.attention passes them; out, seqused_k, the "
             "descales and sinks may be None.");

static PyObject *fastcall_call(PyObject *self, PyObject *args) {
    (void)self;
    Probe p;
    int served = probe_call(args, &p);
    if (served < 0) return NULL;
    Plan *plan = served ? find_plan(&p) : NULL;
    if (plan == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *stream_obj = PyObject_CallObject(torch_api.current_stream, plan->device_args);
    if (stream_obj == NULL) return NULL;
    void *stream = PyLong_AsVoidPtr(stream_obj);
    Py_DECREF(stream_obj);
    if (PyErr_Occurred()) return NULL;
    void *workspace = NULL;
    if (plan->workspace_bytes) {
        int found = kept_workspace(plan, stream, &workspace);
        if (found < 0) return NULL;
        if (!found) Py_RETURN_NONE; /* nothing allocated yet: the Python path allocates one */
    }

    flashcore_forward_params params = plan->template_params;
    PyObject *out = p.arrays[ARRAY_OUT], *lse = NULL;
    if (out == Py_None) {
        out = plan->out_like_q ? PyObject_CallFunctionObjArgs(torch_api.empty_like, p.arrays[ARRAY_Q], NULL)
                               : PyObject_Call(torch_api.empty, plan->out_args, plan->out_kwargs);
        if (out == NULL) return NULL;
    } else {
        Py_INCREF(out);
    }
    if (plan->lse_args != NULL) {
        lse = PyObject_Call(torch_api.empty, plan->lse_args, plan->lse_kwargs);
        if (lse == NULL) goto fail;
    }
    const void *address;
    if (address_of(p.arrays[ARRAY_Q], &params.q) < 0 || address_of(p.arrays[ARRAY_K], &params.k) < 0 ||
        address_of(p.arrays[ARRAY_V], &params.v) < 0 || address_of(out, &address) < 0)
        goto fail;
    params.out = (void *)address;
    if (lse != NULL) {
        if (address_of(lse, &address) < 0) goto fail;
        params.lse = (float *)address;
    }
    if (p.arrays[ARRAY_SEQUSED_K] != Py_None) {
        if (address_of(p.arrays[ARRAY_SEQUSED_K], &address) < 0) goto fail;
        params.seqused_k = (const int32_t *)address;
    }
    const float **floats[NUM_DESCALES + 1] = {&params.q_descale, &params.k_descale, &params.v_descale,
                                              &params.sinks};
    for (int i = 0; i <= NUM_DESCALES; ++i) {
        PyObject *array = p.arrays[ARRAY_Q_DESCALE + i];
        if (array == Py_None) continue;
        if (address_of(array, &address) < 0) goto fail;
        *floats[i] = (const float *)address;
    }

    flashcore_status status;
    Py_BEGIN_ALLOW_THREADS
    status = torch_api.forward(plan->raw_handle, &params, workspace, plan->workspace_bytes, stream);
    Py_END_ALLOW_THREADS
    if (status != FLASHCORE_STATUS_SUCCESS) {
        raise_status(status, "flashcore_forward");
        goto fail;
    }
    if (!plan->options.return_lse) return out;
    PyObject *result = PyTuple_Pack(2, out, lse != NULL ? lse : Py_None);
    Py_DECREF(out);
    Py_XDECREF(lse);
    return result;

fail:
    Py_XDECREF(out);
    Py_XDECREF(lse);
    return NULL;
}

static void clear_plan(Plan *plan) {
    if (!plan->valid) return;
    plan->valid = 0;
    Py_CLEAR(plan->options.layout);
    for (int i = 0; i < NUM_ARRAYS; ++i) {
        if (plan->arrays[i].present) Py_CLEAR(plan->arrays[i].dtype);
    }
    Py_CLEAR(plan->out_args);
    Py_CLEAR(plan->out_kwargs);
    Py_CLEAR(plan->lse_args);
    Py_CLEAR(plan->lse_kwargs);
    Py_CLEAR(plan->handle);
    Py_CLEAR(plan->device_args);
}

/* torch.empty's (args, kwargs) for a tensor of `shape`, or NULL. */
static int empty_arguments(PyObject *shape, PyObject *dtype, PyObject *torch_device, PyObject **args,
                           PyObject **kwargs) {
    *args = PyTuple_Pack(1, shape);
    *kwargs = Py_BuildValue("{sOsO}", "dtype", dtype, "device", torch_device);
    if (*args == NULL || *kwargs == NULL) {
        Py_CLEAR(*args);
        Py_CLEAR(*kwargs);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(remember_doc,
             "remember(q, k, v, out, seqused_k, q_descale, k_descale, v_descale, sinks, layout, options, return_lse, "
             "template, out_like_q, out_shape, dtype, torch_device, lse_shape, lse_dtype, workspace_bytes, handle, "
             "raw_handle, device)\n\n"
             "Keeps the plan of a call the Python path served from its cache (the same arguments as call(), "
             "then what the plan holds: template, the params struct's bytes but for the addresses; out_shape "
             "(None where out is given) and dtype, or out_like_q; lse_shape (None where no lse is returned) and "
             "lse_dtype; "
             "the workspace's bytes; the Handle the calls go to and its flashcore_handle as an int; the "
             "device). Returns whether it was kept: a call this path would not serve is not.");

static PyObject *fastcall_remember(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n = PyTuple_Size(args);
    if (n != CALL_ARGS + 11) {
        PyErr_Format(PyExc_TypeError, "remember() takes %d arguments (%zd given)", CALL_ARGS + 11, n);
        return NULL;
    }
    PyObject *call_args = PyTuple_GetSlice(args, 0, CALL_ARGS);
    if (call_args == NULL) return NULL;
    Probe p;
    int served = probe_call(call_args, &p);
    Py_DECREF(call_args);
    if (served <= 0) {
        if (served < 0) return NULL;
        Py_RETURN_FALSE;
    }
    /* What the plan holds, after the call's arguments. */
    Py_ssize_t at = CALL_ARGS;
    PyObject *template_bytes = PyTuple_GetItem(args, at), *out_like_q = PyTuple_GetItem(args, at + 1),
             *out_shape = PyTuple_GetItem(args, at + 2), *dtype = PyTuple_GetItem(args, at + 3),
             *torch_device = PyTuple_GetItem(args, at + 4), *lse_shape = PyTuple_GetItem(args, at + 5),
             *lse_dtype = PyTuple_GetItem(args, at + 6), *workspace_bytes = PyTuple_GetItem(args, at + 7),
             *handle = PyTuple_GetItem(args, at + 8), *raw_handle = PyTuple_GetItem(args, at + 9),
             *device = PyTuple_GetItem(args, at + 10);
    if (!PyBytes_Check(template_bytes) || PyBytes_Size(template_bytes) != (Py_ssize_t)sizeof(flashcore_forward_params)) {
        PyErr_Format(PyExc_ValueError, "template must be the %zu bytes of a flashcore_forward_params",
                     sizeof(flashcore_forward_params));
        return NULL;
    }
    /* A plan for these arrays and options is replaced in its slot. */
    Plan *slot = find_plan(&p);
    if (PyErr_Occurred()) return NULL;

    Plan fresh;
    memset(&fresh, 0, sizeof fresh);
    memcpy(&fresh.template_params, PyBytes_AsString(template_bytes), sizeof fresh.template_params);
    fresh.options = p.call_options;
    memcpy(fresh.arrays, p.meta, sizeof fresh.arrays);
    int truth = PyObject_IsTrue(out_like_q);
    if (truth < 0) return NULL;
    fresh.out_like_q = truth && p.arrays[ARRAY_OUT] == Py_None;
    fresh.workspace_bytes = PyLong_AsSize_t(workspace_bytes);
    fresh.raw_handle = (flashcore_handle)PyLong_AsVoidPtr(raw_handle);
    fresh.device = PyLong_AsLong(device);
    if (PyErr_Occurred()) return NULL;
    if (fresh.raw_handle == NULL) {
        PyErr_SetString(PyExc_ValueError, "raw_handle is NULL");
        return NULL;
    }
    if (p.arrays[ARRAY_OUT] == Py_None && !fresh.out_like_q &&
        empty_arguments(out_shape, dtype, torch_device, &fresh.out_args, &fresh.out_kwargs) < 0)
        goto fail;
    if (lse_shape != Py_None &&
        empty_arguments(lse_shape, lse_dtype, torch_device, &fresh.lse_args, &fresh.lse_kwargs) < 0)
        goto fail;
    fresh.device_args = Py_BuildValue("(l)", fresh.device);
    if (fresh.device_args == NULL) goto fail;
    fresh.handle = handle;
    Py_INCREF(handle);
    Py_INCREF(fresh.options.layout);
    for (int i = 0; i < NUM_ARRAYS; ++i) {
        if (fresh.arrays[i].present) Py_INCREF(fresh.arrays[i].dtype);
    }
    fresh.valid = 1;

    if (slot == NULL) slot = &plans[next_victim++ % FASTCALL_MAX_PLANS];
    clear_plan(slot);
    *slot = fresh;
    Py_RETURN_TRUE;

fail:
    Py_XDECREF(fresh.out_args);
    Py_XDECREF(fresh.out_kwargs);
    Py_XDECREF(fresh.lse_args);
    Py_XDECREF(fresh.lse_kwargs);
    Py_XDECREF(fresh.device_args);
    return NULL;
}

/* ---- the backward pass -------------------------------------------------- */

/* The tensors a backward plan describes: those backward() takes first, in
 * its order, then the sinks (an argument of its own, later). */
enum { BWD_DOUT, BWD_Q, BWD_K, BWD_V, BWD_OUT, BWD_LSE, BWD_SEQUSED_K, NUM_BWD_ARRAYS };
enum { BWD_META_SINKS = NUM_BWD_ARRAYS, NUM_BWD_META };
/* backward()'s arguments: flashcore::backward's, in its order. */
enum {
    BWD_ARG_CU_SEQLENS_Q = NUM_BWD_ARRAYS,
    BWD_ARG_CU_SEQLENS_K,
    BWD_ARG_MAX_SEQLEN_Q,
    BWD_ARG_MAX_SEQLEN_K,
    BWD_ARG_LAYOUT,
    BWD_ARG_CAUSAL,
    BWD_ARG_SOFTMAX_SCALE,
    BWD_ARG_WINDOW,
    BWD_ARG_SOFTCAP,
    BWD_ARG_DETERMINISTIC,
    BWD_ARG_ATTENTION_CHUNK,
    BWD_ARG_SINKS,
    BWD_ARG_COMPUTE_DSINKS,
    BWD_ARG_SM_MARGIN,
    BWD_CALL_ARGS
};
/* Backward plans kept, replaced round robin: a model's few attention shapes. */
#define FASTCALL_MAX_BACKWARD_PLANS 16

/* The options a backward plan matches, as _planning.prepare_backward keys
 * them (deterministic: the call's or'ed with torch's flag). */
typedef struct {
    PyObject *layout; /* str; a strong reference in a plan */
    int causal;
    int has_scale;
    double softmax_scale;
    int has_window;
    long window_left, window_right;
    double softcap;
    int deterministic;
    long attention_chunk;
    long sm_margin; /* it changes the plan (the deterministic schedule), so it is matched */
    int compute_dsinks; /* dsinks, torch.empty_like(sinks), is written */
} BackwardOptions;

typedef struct {
    int valid;
    BackwardOptions options;
    ArrayMeta arrays[NUM_BWD_META];
    flashcore_backward_params template_params;
    size_t workspace_bytes;
    PyObject *workspace_args, *workspace_kwargs; /* torch.empty's, for the workspace */
    PyObject *handle;                            /* the Python Handle, kept alive while the plan is */
    flashcore_handle raw_handle;
    PyObject *device_args; /* (device,): the current-stream query's argument */
} BackwardPlan;

static BackwardPlan backward_plans[FASTCALL_MAX_BACKWARD_PLANS];
static unsigned next_backward_victim;

typedef struct {
    PyObject *args[BWD_CALL_ARGS];
    ArrayMeta meta[NUM_BWD_META];
    BackwardOptions options;
} BackwardProbe;

/* Reads a 2-int window (list or tuple of exact ints). 1, 0 or -1. */
static int read_window(PyObject *window, long *left, long *right) {
    if (!(PyList_CheckExact(window) || PyTuple_CheckExact(window)) || PySequence_Size(window) != 2) return 0;
    PyObject *l = PySequence_GetItem(window, 0), *r = PySequence_GetItem(window, 1);
    int served = l != NULL && r != NULL && PyLong_CheckExact(l) && PyLong_CheckExact(r);
    if (served) {
        *left = PyLong_AsLong(l);
        *right = PyLong_AsLong(r);
        if (PyErr_Occurred()) served = 0;
    }
    Py_XDECREF(l);
    Py_XDECREF(r);
    PyErr_Clear();
    return served;
}

/* Unpacks flashcore::backward's 21 arguments and reads them: 1 when this
 * path may serve the call (dense: no cu_seqlens or max_seqlen; plain values
 * of the schema's types; compute_dsinks only with sinks), 0 or -1 as
 * probe_call(). */
static int probe_backward(PyObject *args, BackwardProbe *p) {
    if (PyTuple_Size(args) != BWD_CALL_ARGS) {
        PyErr_Format(PyExc_TypeError, "backward() takes %d arguments (%zd given)", BWD_CALL_ARGS, PyTuple_Size(args));
        return -1;
    }
    for (int i = 0; i < BWD_CALL_ARGS; ++i) p->args[i] = PyTuple_GetItem(args, i);
    if (!torch_api.configured || torch_api.backward == NULL) return 0;
    for (int i = BWD_ARG_CU_SEQLENS_Q; i <= BWD_ARG_MAX_SEQLEN_K; ++i)
        if (p->args[i] != Py_None) return 0; /* packed sequences: their gradients are zeroed first (Python path) */
    for (int i = 0; i < NUM_BWD_ARRAYS; ++i) {
        PyObject *a = p->args[i];
        if (a == Py_None && i == BWD_SEQUSED_K) {
            p->meta[i].present = 0;
            continue;
        }
        if (!is_plain_tensor(a)) return 0;
        int read = read_meta(a, &p->meta[i]);
        if (read <= 0) return read;
    }
    PyObject *sinks = p->args[BWD_ARG_SINKS];
    p->meta[BWD_META_SINKS].present = 0;
    if (sinks != Py_None) {
        if (!is_plain_tensor(sinks)) return 0;
        int read = read_meta(sinks, &p->meta[BWD_META_SINKS]);
        if (read <= 0) return read;
    }
    BackwardOptions *o = &p->options;
    PyObject *layout = p->args[BWD_ARG_LAYOUT], *causal = p->args[BWD_ARG_CAUSAL],
             *scale = p->args[BWD_ARG_SOFTMAX_SCALE], *window = p->args[BWD_ARG_WINDOW],
             *softcap = p->args[BWD_ARG_SOFTCAP], *deterministic = p->args[BWD_ARG_DETERMINISTIC],
             *attention_chunk = p->args[BWD_ARG_ATTENTION_CHUNK], *compute_dsinks = p->args[BWD_ARG_COMPUTE_DSINKS],
             *sm_margin = p->args[BWD_ARG_SM_MARGIN];
    if (!PyUnicode_CheckExact(layout) || !PyBool_Check(causal) || !PyFloat_CheckExact(softcap) ||
        !PyBool_Check(deterministic) || !PyBool_Check(compute_dsinks))
        return 0;
    if (!read_int(attention_chunk, &o->attention_chunk) || !read_int(sm_margin, &o->sm_margin)) return 0;
    o->compute_dsinks = compute_dsinks == Py_True;
    if (o->compute_dsinks && sinks == Py_None) return 0; /* the Python path says why not */
    o->layout = layout;
    o->causal = causal == Py_True;
    o->has_scale = scale != Py_None;
    o->softmax_scale = 0.0;
    if (o->has_scale) {
        if (!PyFloat_CheckExact(scale)) return 0;
        o->softmax_scale = PyFloat_AsDouble(scale);
    }
    o->has_window = window != Py_None;
    o->window_left = o->window_right = 0;
    if (o->has_window && !read_window(window, &o->window_left, &o->window_right)) return 0;
    o->softcap = PyFloat_AsDouble(softcap);
    o->deterministic = deterministic == Py_True;
    if (!o->deterministic) {
        PyObject *flag = PyObject_CallObject(torch_api.deterministic_enabled, NULL);
        if (flag == NULL) return -1;
        o->deterministic = PyObject_IsTrue(flag);
        Py_DECREF(flag);
        if (o->deterministic < 0) return -1;
    }
    return 1;
}

static int same_backward_options(const BackwardOptions *a, const BackwardOptions *b) {
    if (a->causal != b->causal || a->has_scale != b->has_scale || a->has_window != b->has_window ||
        a->softcap != b->softcap || a->deterministic != b->deterministic ||
        a->attention_chunk != b->attention_chunk || a->sm_margin != b->sm_margin ||
        a->compute_dsinks != b->compute_dsinks)
        return 0;
    if (a->has_scale && a->softmax_scale != b->softmax_scale) return 0;
    if (a->has_window && (a->window_left != b->window_left || a->window_right != b->window_right)) return 0;
    if (a->layout == b->layout) return 1;
    return PyUnicode_Compare(a->layout, b->layout) == 0 && !PyErr_Occurred();
}

static BackwardPlan *find_backward_plan(const BackwardProbe *p) {
    for (int i = 0; i < FASTCALL_MAX_BACKWARD_PLANS; ++i) {
        BackwardPlan *plan = &backward_plans[i];
        if (!plan->valid || !same_backward_options(&plan->options, &p->options)) continue;
        int same = 1;
        for (int a = 0; a < NUM_BWD_META && same; ++a) same = same_meta(&plan->arrays[a], &p->meta[a]);
        if (same) return plan;
    }
    return NULL;
}

static void clear_backward_plan(BackwardPlan *plan) {
    if (!plan->valid) return;
    plan->valid = 0;
    Py_CLEAR(plan->options.layout);
    for (int i = 0; i < NUM_BWD_META; ++i) {
        if (plan->arrays[i].present) Py_CLEAR(plan->arrays[i].dtype);
    }
    Py_CLEAR(plan->workspace_args);
    Py_CLEAR(plan->workspace_kwargs);
    Py_CLEAR(plan->handle);
    Py_CLEAR(plan->device_args);
}

PyDoc_STRVAR(stub_backward_address_doc,
             "stub_backward_address()\n\n"
             "The address of a function with flashcore_backward's signature that returns success and queues "
             "nothing, for configure_backward() in benchmarks and tests.");

static PyObject *fastcall_stub_backward_address(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromVoidPtr((void *)stub_backward);
}

PyDoc_STRVAR(backward_doc,
             "backward(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
             "max_seqlen_k, layout, causal, softmax_scale, window, softcap, deterministic, attention_chunk, sinks, "
             "compute_dsinks, sm_margin)\n\n"
             "flashcore::backward's call where a remembered plan serves it: queues flashcore_backward on "
             "torch's current stream and returns (dq, dk, dv, dsinks), new tensors from torch.empty_like of q, k, "
             "v and (with compute_dsinks) sinks, dsinks None without compute_dsinks; None where no plan serves it "
             "(packed sequences, a dout whose address is not aligned, or shapes, strides, dtypes, devices or "
             "options no plan has), and the caller takes the Python path.");

static PyObject *fastcall_backward(PyObject *self, PyObject *args) {
    (void)self;
    BackwardProbe p;
    int served = probe_backward(args, &p);
    if (served < 0) return NULL;
    BackwardPlan *plan = served ? find_backward_plan(&p) : NULL;
    if (plan == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    flashcore_backward_params params = plan->template_params;
    const void *address;
    /* Autograd hands over whatever gradient the next operation made: one at
     * an address the library does not take is copied by the Python path. */
    if (address_of(p.args[BWD_DOUT], &params.dout) < 0) return NULL;
    if ((uintptr_t)params.dout % FLASHCORE_ALIGNMENT != 0) Py_RETURN_NONE;
    if (address_of(p.args[BWD_Q], &params.q) < 0 || address_of(p.args[BWD_K], &params.k) < 0 ||
        address_of(p.args[BWD_V], &params.v) < 0 || address_of(p.args[BWD_OUT], &params.out) < 0 ||
        address_of(p.args[BWD_LSE], &address) < 0)
        return NULL;
    params.lse = (const float *)address;
    if (p.args[BWD_SEQUSED_K] != Py_None) {
        if (address_of(p.args[BWD_SEQUSED_K], &address) < 0) return NULL;
        params.seqused_k = (const int32_t *)address;
    }
    if (p.args[BWD_ARG_SINKS] != Py_None) {
        if (address_of(p.args[BWD_ARG_SINKS], &address) < 0) return NULL;
        params.sinks = (const float *)address;
    }
    PyObject *stream_obj = PyObject_CallObject(torch_api.current_stream, plan->device_args);
    if (stream_obj == NULL) return NULL;
    void *stream = PyLong_AsVoidPtr(stream_obj);
    Py_DECREF(stream_obj);
    if (PyErr_Occurred()) return NULL;

    PyObject *grads[4] = {NULL, NULL, NULL, NULL}, *workspace = NULL, *result = NULL;
    void **grad_fields[3] = {&params.dq, &params.dk, &params.dv};
    for (int i = 0; i < 3; ++i) {
        grads[i] = PyObject_CallFunctionObjArgs(torch_api.empty_like, p.args[BWD_Q + i], NULL);
        if (grads[i] == NULL || address_of(grads[i], &address) < 0) goto done;
        *grad_fields[i] = (void *)address;
    }
    if (plan->options.compute_dsinks) {
        /* Like sinks, float32 [Hq] (the plan's sinks were checked to be),
         * written whole by the library. */
        grads[3] = PyObject_CallFunctionObjArgs(torch_api.empty_like, p.args[BWD_ARG_SINKS], NULL);
        if (grads[3] == NULL || address_of(grads[3], &address) < 0) goto done;
        params.dsinks = (float *)address;
    }
    void *workspace_address = NULL;
    if (plan->workspace_bytes) {
        /* A new tensor per call, dropped after the launch: the allocator
         * orders its reuse after this call on the stream (and a CUDA graph
         * being captured gets one from its own pool). */
        workspace = PyObject_Call(torch_api.empty, plan->workspace_args, plan->workspace_kwargs);
        if (workspace == NULL || address_of(workspace, &address) < 0) goto done;
        workspace_address = (void *)address;
    }
    flashcore_status status;
    Py_BEGIN_ALLOW_THREADS
    status = torch_api.backward(plan->raw_handle, &params, workspace_address, plan->workspace_bytes, stream);
    Py_END_ALLOW_THREADS
    if (status != FLASHCORE_STATUS_SUCCESS) {
        raise_status(status, "flashcore_backward");
        goto done;
    }
    result = PyTuple_Pack(4, grads[0], grads[1], grads[2], grads[3] != NULL ? grads[3] : Py_None);

done:
    for (int i = 0; i < 4; ++i) Py_XDECREF(grads[i]);
    Py_XDECREF(workspace);
    return result;
}

PyDoc_STRVAR(remember_backward_doc,
             "remember_backward(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
             "max_seqlen_k, layout, causal, softmax_scale, window, softcap, deterministic, attention_chunk, sinks, "
             "compute_dsinks, sm_margin, template, "
             "workspace_bytes, torch_device, handle, raw_handle, device)\n\n"
             "Keeps the plan of a backward call the Python path served (backward()'s arguments, then template: "
             "the flashcore_backward_params bytes but for the addresses; the workspace's bytes; the torch "
             "device to allocate it on; the Handle the calls go to, its flashcore_handle as an int, and the "
             "device index). The Python path must have queued dout as given (not a copy of it). Returns "
             "whether it was kept: a call backward() would not serve is not.");

static PyObject *fastcall_remember_backward(PyObject *self, PyObject *args) {
    (void)self;
    const Py_ssize_t extra = 6;
    Py_ssize_t n = PyTuple_Size(args);
    if (n != BWD_CALL_ARGS + extra) {
        PyErr_Format(PyExc_TypeError, "remember_backward() takes %d arguments (%zd given)",
                     (int)(BWD_CALL_ARGS + extra), n);
        return NULL;
    }
    PyObject *call_args = PyTuple_GetSlice(args, 0, BWD_CALL_ARGS);
    if (call_args == NULL) return NULL;
    BackwardProbe p;
    int served = probe_backward(call_args, &p);
    Py_DECREF(call_args);
    if (served <= 0) {
        if (served < 0) return NULL;
        Py_RETURN_FALSE;
    }
    Py_ssize_t at = BWD_CALL_ARGS;
    PyObject *template_bytes = PyTuple_GetItem(args, at), *workspace_bytes = PyTuple_GetItem(args, at + 1),
             *torch_device = PyTuple_GetItem(args, at + 2), *handle = PyTuple_GetItem(args, at + 3),
             *raw_handle = PyTuple_GetItem(args, at + 4), *device = PyTuple_GetItem(args, at + 5);
    if (!PyBytes_Check(template_bytes) ||
        PyBytes_Size(template_bytes) != (Py_ssize_t)sizeof(flashcore_backward_params)) {
        PyErr_Format(PyExc_ValueError, "template must be the %zu bytes of a flashcore_backward_params",
                     sizeof(flashcore_backward_params));
        return NULL;
    }
    BackwardPlan *slot = find_backward_plan(&p);
    if (PyErr_Occurred()) return NULL;

    BackwardPlan fresh;
    memset(&fresh, 0, sizeof fresh);
    memcpy(&fresh.template_params, PyBytes_AsString(template_bytes), sizeof fresh.template_params);
    fresh.options = p.options;
    memcpy(fresh.arrays, p.meta, sizeof fresh.arrays);
    fresh.workspace_bytes = PyLong_AsSize_t(workspace_bytes);
    fresh.raw_handle = (flashcore_handle)PyLong_AsVoidPtr(raw_handle);
    long device_index = PyLong_AsLong(device);
    if (PyErr_Occurred()) return NULL;
    if (fresh.raw_handle == NULL) {
        PyErr_SetString(PyExc_ValueError, "raw_handle is NULL");
        return NULL;
    }
    if (fresh.workspace_bytes) {
        PyObject *shape = Py_BuildValue("(n)", (Py_ssize_t)fresh.workspace_bytes);
        int failed = shape == NULL || empty_arguments(shape, torch_api.uint8, torch_device, &fresh.workspace_args,
                                                      &fresh.workspace_kwargs) < 0;
        Py_XDECREF(shape);
        if (failed) return NULL;
    }
    fresh.device_args = Py_BuildValue("(l)", device_index);
    if (fresh.device_args == NULL) {
        Py_XDECREF(fresh.workspace_args);
        Py_XDECREF(fresh.workspace_kwargs);
        return NULL;
    }
    fresh.handle = handle;
    Py_INCREF(handle);
    Py_INCREF(fresh.options.layout);
    for (int i = 0; i < NUM_BWD_META; ++i) {
        if (fresh.arrays[i].present) Py_INCREF(fresh.arrays[i].dtype);
    }
    fresh.valid = 1;

    if (slot == NULL) slot = &backward_plans[next_backward_victim++ % FASTCALL_MAX_BACKWARD_PLANS];
    clear_backward_plan(slot);
    *slot = fresh;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(configure_backward_doc,
             "configure_backward(backward, deterministic_enabled, uint8)\n\n"
             "Sets what backward() uses besides configure()'s: flashcore_backward's address (an int), "
             "torch.are_deterministic_algorithms_enabled and torch.uint8 (the workspace's dtype). Forgets every "
             "backward plan.");

static PyObject *fastcall_configure_backward(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *backward, *deterministic_enabled, *uint8;
    if (!PyArg_UnpackTuple(args, "configure_backward", 3, 3, &backward, &deterministic_enabled, &uint8)) return NULL;
    void *backward_address = PyLong_AsVoidPtr(backward);
    if (backward_address == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "backward is NULL");
        return NULL;
    }
    for (int i = 0; i < FASTCALL_MAX_BACKWARD_PLANS; ++i) clear_backward_plan(&backward_plans[i]);
    PyObject *old[] = {torch_api.deterministic_enabled, torch_api.uint8};
    Py_INCREF(deterministic_enabled);
    Py_INCREF(uint8);
    torch_api.deterministic_enabled = deterministic_enabled;
    torch_api.uint8 = uint8;
    Py_XDECREF(old[0]);
    Py_XDECREF(old[1]);
    torch_api.backward = (backward_fn)backward_address;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(backward_params_layout_doc,
             "backward_params_layout()\n\n"
             "(sizeof, {field: offset}) of flashcore_backward_params as this module was compiled, for the "
             "fields backward() writes.");

static PyObject *fastcall_backward_params_layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(n{snsnsnsnsnsnsnsnsnsnsnsnsn})", (Py_ssize_t)sizeof(flashcore_backward_params),
                         "struct_size", (Py_ssize_t)offsetof(flashcore_backward_params, struct_size), "q",
                         (Py_ssize_t)offsetof(flashcore_backward_params, q), "k",
                         (Py_ssize_t)offsetof(flashcore_backward_params, k), "v",
                         (Py_ssize_t)offsetof(flashcore_backward_params, v), "out",
                         (Py_ssize_t)offsetof(flashcore_backward_params, out), "dout",
                         (Py_ssize_t)offsetof(flashcore_backward_params, dout), "lse",
                         (Py_ssize_t)offsetof(flashcore_backward_params, lse), "dq",
                         (Py_ssize_t)offsetof(flashcore_backward_params, dq), "dk",
                         (Py_ssize_t)offsetof(flashcore_backward_params, dk), "dv",
                         (Py_ssize_t)offsetof(flashcore_backward_params, dv), "seqused_k",
                         (Py_ssize_t)offsetof(flashcore_backward_params, seqused_k), "sinks",
                         (Py_ssize_t)offsetof(flashcore_backward_params, sinks), "dsinks",
                         (Py_ssize_t)offsetof(flashcore_backward_params, dsinks));
}

PyDoc_STRVAR(clear_doc, "clear()\n\nForgets every plan, forward and backward (their handles and dtypes are released).");

static PyObject *fastcall_clear(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    for (int i = 0; i < FASTCALL_MAX_PLANS; ++i) clear_plan(&plans[i]);
    for (int i = 0; i < FASTCALL_MAX_BACKWARD_PLANS; ++i) clear_backward_plan(&backward_plans[i]);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(configure_doc,
             "configure(forward, check, tensor_type, is_grad_enabled, empty, empty_like, current_stream, "
             "capturing, kept_workspaces, parameter_type=None)\n\n"
             "Sets what call() uses: flashcore_forward's address (an int), the binding's status check (raises), "
             "torch.Tensor, torch.is_grad_enabled, torch.empty, torch.empty_like, a function of a device index "
             "giving torch's current stream there as an int, one saying whether it is being captured, the "
             "binding's dict of kept workspaces, and torch.nn.Parameter, the one subclass of torch.Tensor read "
             "as a tensor (None: none). Forgets every plan.");

static PyObject *fastcall_configure(PyObject *self, PyObject *args) {
    PyObject *forward, *check, *tensor_type, *is_grad_enabled, *empty, *empty_like, *current_stream, *capturing,
        *kept_workspaces, *parameter_type = Py_None;
    if (!PyArg_UnpackTuple(args, "configure", 9, 10, &forward, &check, &tensor_type, &is_grad_enabled, &empty,
                           &empty_like, &current_stream, &capturing, &kept_workspaces, &parameter_type))
        return NULL;
    if (!PyDict_Check(kept_workspaces)) {
        PyErr_SetString(PyExc_TypeError, "kept_workspaces must be a dict");
        return NULL;
    }
    void *forward_address = PyLong_AsVoidPtr(forward);
    if (forward_address == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "forward is NULL");
        return NULL;
    }
    PyObject *stride = PyObject_GetAttrString(tensor_type, "stride");
    PyObject *get_device = PyObject_GetAttrString(tensor_type, "get_device");
    PyObject *data_ptr = PyObject_GetAttrString(tensor_type, "data_ptr");
    if (stride == NULL || get_device == NULL || data_ptr == NULL) {
        Py_XDECREF(stride);
        Py_XDECREF(get_device);
        Py_XDECREF(data_ptr);
        return NULL;
    }
    fastcall_clear(self, NULL);
    PyObject **slots[] = {&torch_api.check,           &torch_api.tensor_type,    &torch_api.is_grad_enabled,
                          &torch_api.empty,           &torch_api.empty_like,     &torch_api.current_stream,
                          &torch_api.capturing,       &torch_api.kept_workspaces, &torch_api.parameter_type};
    PyObject *values[] = {check, tensor_type, is_grad_enabled, empty, empty_like, current_stream, capturing,
                          kept_workspaces, parameter_type};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; ++i) {
        PyObject *old = *slots[i];
        Py_INCREF(values[i]);
        *slots[i] = values[i];
        Py_XDECREF(old);
    }
    PyObject *old_methods[] = {torch_api.stride, torch_api.get_device, torch_api.data_ptr};
    torch_api.stride = stride;
    torch_api.get_device = get_device;
    torch_api.data_ptr = data_ptr;
    for (size_t i = 0; i < sizeof old_methods / sizeof old_methods[0]; ++i) Py_XDECREF(old_methods[i]);
    torch_api.forward = (forward_fn)forward_address;
    torch_api.configured = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(params_layout_doc,
             "params_layout()\n\n"
             "(sizeof, {field: offset}) of flashcore_forward_params as this module was compiled: the binding "
             "uses the module only where its ctypes struct agrees.");

static PyObject *fastcall_params_layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(n{snsnsnsnsnsnsnsnsnsnsn})", (Py_ssize_t)sizeof(flashcore_forward_params), "struct_size",
                         (Py_ssize_t)offsetof(flashcore_forward_params, struct_size), "q",
                         (Py_ssize_t)offsetof(flashcore_forward_params, q), "k",
                         (Py_ssize_t)offsetof(flashcore_forward_params, k), "v",
                         (Py_ssize_t)offsetof(flashcore_forward_params, v), "out",
                         (Py_ssize_t)offsetof(flashcore_forward_params, out), "lse",
                         (Py_ssize_t)offsetof(flashcore_forward_params, lse), "seqused_k",
                         (Py_ssize_t)offsetof(flashcore_forward_params, seqused_k), "q_descale",
                         (Py_ssize_t)offsetof(flashcore_forward_params, q_descale), "k_descale",
                         (Py_ssize_t)offsetof(flashcore_forward_params, k_descale), "v_descale",
                         (Py_ssize_t)offsetof(flashcore_forward_params, v_descale), "sinks",
                         (Py_ssize_t)offsetof(flashcore_forward_params, sinks));
}

static PyMethodDef fastcall_methods[] = {
    {"call", fastcall_call, METH_VARARGS, call_doc},
    {"remember", fastcall_remember, METH_VARARGS, remember_doc},
    {"clear", fastcall_clear, METH_NOARGS, clear_doc},
    {"configure", fastcall_configure, METH_VARARGS, configure_doc},
    {"params_layout", fastcall_params_layout, METH_NOARGS, params_layout_doc},
    {"stub_forward_address", fastcall_stub_forward_address, METH_NOARGS, stub_forward_address_doc},
    {"backward", fastcall_backward, METH_VARARGS, backward_doc},
    {"remember_backward", fastcall_remember_backward, METH_VARARGS, remember_backward_doc},
    {"configure_backward", fastcall_configure_backward, METH_VARARGS, configure_backward_doc},
    {"backward_params_layout", fastcall_backward_params_layout, METH_NOARGS, backward_params_layout_doc},
    {"stub_backward_address", fastcall_stub_backward_address, METH_NOARGS, stub_backward_address_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastcall_module = {
    PyModuleDef_HEAD_INIT, "_fastcall",
    "The compiled host path of repeated flashcore.attention calls on torch tensors (internal).", -1,
    fastcall_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) {
    str_shape = PyUnicode_InternFromString("shape");
    str_dtype = PyUnicode_InternFromString("dtype");
    str_requires_grad = PyUnicode_InternFromString("requires_grad");
    if (str_shape == NULL || str_dtype == NULL || str_requires_grad == NULL) return NULL;
    return PyModule_Create(&fastcall_module);
}
