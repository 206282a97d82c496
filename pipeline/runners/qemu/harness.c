/* Runs one TVM-compiled llvm kernel (its object file linked in) on tensors read from a file, and
 * writes every tensor back: the executable that pipeline/runners/qemu_arm.py runs under qemu-user.
 * It stands in for the few TVM runtime entry points a kernel object calls: the parallel launch
 * (one POSIX thread per task), the workspace allocator and the error setter.
 *
 * File layout (little endian; the same for input and output): int32 count, then per argument
 * int32 ndim, uint8 dtype code, uint8 bits, uint16 lanes, int64 shape[ndim], then the bytes.
 * ndim -1 is a scalar: 8 bytes, int64 (code 0) or double (code 2). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>
#include <tvm/runtime/c_backend_api.h>

#define MAX_TENSORS 16
#define MAX_TASKS 64

int __tvm_ffi_main(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);
/* function pointers a kernel object defines when it uses them (weak: absent otherwise) */
extern int (*__TVMBackendParallelLaunch)(FTVMParallelLambda, void*, int) __attribute__((weak));
extern void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) __attribute__((weak));
extern int (*__TVMBackendFreeWorkspace)(int, int, void*) __attribute__((weak));

static int num_threads = 2;

typedef struct {
  FTVMParallelLambda flambda;
  void* cdata;
  int task_id;
  TVMParallelGroupEnv* env;
  int status;
} Task;

static void* run_task(void* arg) {
  Task* t = (Task*)arg;
  t->status = t->flambda(t->task_id, t->env, t->cdata);
  return NULL;
}

static int parallel_launch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  if (num_task <= 0 || num_task > num_threads) num_task = num_threads;
  TVMParallelGroupEnv env = {NULL, num_task};
  Task tasks[MAX_TASKS];
  pthread_t threads[MAX_TASKS];
  for (int i = 0; i < num_task; ++i) {
    tasks[i] = (Task){flambda, cdata, i, &env, 0};
    if (i > 0 && pthread_create(&threads[i], NULL, run_task, &tasks[i]) != 0) return -1;
  }
  run_task(&tasks[0]);
  int status = tasks[0].status;
  for (int i = 1; i < num_task; ++i) {
    pthread_join(threads[i], NULL);
    if (tasks[i].status != 0) status = tasks[i].status;
  }
  return status;
}

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  (void)device_type, (void)device_id, (void)code, (void)bits;
  void* ptr = NULL;
  return posix_memalign(&ptr, 64, nbytes ? nbytes : 1) == 0 ? ptr : NULL;
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t num_parts) {
  fprintf(stderr, "%s:", kind ? kind : "Error");
  for (int i = 0; i < num_parts; ++i)
    if (parts[i]) fprintf(stderr, " %s", parts[i]);
  fprintf(stderr, "\n");
}

static int fail(const char* what, const char* path) {
  fprintf(stderr, "harness: %s %s\n", what, path);
  return 2;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s THREADS IN OUT\n", argv[0]);
    return 2;
  }
  num_threads = atoi(argv[1]);
  if (num_threads < 1 || num_threads > MAX_TASKS) return fail("bad thread count", argv[1]);
  if (&__TVMBackendParallelLaunch) __TVMBackendParallelLaunch = parallel_launch;
  if (&__TVMBackendAllocWorkspace) __TVMBackendAllocWorkspace = alloc_workspace;
  if (&__TVMBackendFreeWorkspace) __TVMBackendFreeWorkspace = free_workspace;

  FILE* in = fopen(argv[2], "rb");
  if (!in) return fail("cannot read", argv[2]);
  int32_t count = 0;
  if (fread(&count, 4, 1, in) != 1 || count < 1 || count > MAX_TENSORS) return fail("bad tensor count in", argv[2]);
  DLTensor tensors[MAX_TENSORS];
  int64_t shapes[MAX_TENSORS][8];
  size_t sizes[MAX_TENSORS];
  TVMFFIAny args[MAX_TENSORS];
  memset(tensors, 0, sizeof(tensors));
  memset(args, 0, sizeof(args));
  for (int i = 0; i < count; ++i) {
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    if (fread(&ndim, 4, 1, in) != 1 || ndim < -1 || ndim > 8 || fread(&code, 1, 1, in) != 1 || fread(&bits, 1, 1, in) != 1 ||
        fread(&lanes, 2, 1, in) != 1 || (ndim > 0 && fread(shapes[i], 8, (size_t)ndim, in) != (size_t)ndim))
      return fail("bad tensor header in", argv[2]);
    if (ndim == -1) {  /* a scalar argument */
      tensors[i].ndim = -1;
      sizes[i] = 0;
      if (fread(&args[i].v_int64, 8, 1, in) != 1) return fail("short scalar in", argv[2]);
      args[i].type_index = code == kDLFloat ? kTVMFFIFloat : kTVMFFIInt;
      continue;
    }
    size_t n = (size_t)(bits * lanes + 7) / 8;
    for (int d = 0; d < ndim; ++d) n *= (size_t)shapes[i][d];
    void* data = alloc_workspace(1, 0, n, code, bits);
    if (!data || fread(data, 1, n, in) != n) return fail("short tensor data in", argv[2]);
    tensors[i] = (DLTensor){data, {kDLCPU, 0}, ndim, {code, bits, lanes}, shapes[i], NULL, 0};
    sizes[i] = n;
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &tensors[i];
  }
  fclose(in);

  TVMFFIAny result;
  memset(&result, 0, sizeof(result));
  int status = __tvm_ffi_main(NULL, args, count, &result);
  if (status != 0) {
    fprintf(stderr, "harness: the kernel returned %d\n", status);
    return 1;
  }

  FILE* out = fopen(argv[3], "wb");
  if (!out) return fail("cannot write", argv[3]);
  fwrite(&count, 4, 1, out);
  for (int i = 0; i < count; ++i) {
    const DLTensor* t = &tensors[i];
    if (t->ndim == -1) {  /* scalars come back as they went */
      int32_t scalar = -1;
      uint8_t code = args[i].type_index == kTVMFFIFloat ? kDLFloat : kDLInt, bits = 64;
      uint16_t lanes = 1;
      fwrite(&scalar, 4, 1, out), fwrite(&code, 1, 1, out), fwrite(&bits, 1, 1, out), fwrite(&lanes, 2, 1, out);
      fwrite(&args[i].v_int64, 8, 1, out);
      continue;
    }
    fwrite(&t->ndim, 4, 1, out);
    fwrite(&t->dtype.code, 1, 1, out);
    fwrite(&t->dtype.bits, 1, 1, out);
    fwrite(&t->dtype.lanes, 2, 1, out);
    fwrite(t->shape, 8, t->ndim, out);
    fwrite(t->data, 1, sizes[i], out);
  }
  return fclose(out) == 0 ? 0 : fail("cannot write", argv[3]);
}
