/* A QEMU TCG plugin (user mode, plugin API version 1: QEMU 4.2 to 8.1) that counts the guest
 * instructions executed, and among them those outside every symbol of the loaded binary. For
 * a statically linked zygvm, those are the JIT's generated code (and the vDSO's few): the
 * same measure on both architectures, whatever the host (`count.sh` runs it).
 *
 * The few declarations of <qemu-plugin.h> it uses are written out here: Debian's qemu-user
 * ships the plugin interface but not its header. */
#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb; struct qemu_plugin_insn; struct qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*udata_cb)(qemu_plugin_id_t, void *);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
const char *qemu_plugin_insn_symbol(const struct qemu_plugin_insn *);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb, void *);
void qemu_plugin_outs(const char *);
__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t jit, all;
static void trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    size_t n = qemu_plugin_tb_n_insns(tb), anon = 0;
    for (size_t i = 0; i < n; i++) anon += qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, i)) == NULL;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &all, n);
    if (anon) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &jit, anon);
}
static void done(qemu_plugin_id_t id, void *p) {
    char buf[128];
    snprintf(buf, sizeof buf, "insns: anonymous %llu total %llu\n", (unsigned long long)jit, (unsigned long long)all);
    qemu_plugin_outs(buf);
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const struct qemu_info_t *info, int argc, char **argv) {
    qemu_plugin_register_vcpu_tb_trans_cb(id, trans);
    qemu_plugin_register_atexit_cb(id, done, NULL);
    return 0;
}
