// The shell, KernelShell<Mainloop, Epilogue, Scheduler>, is the shape of
// every portable (sm_80+) kernel: one CTA, one work item, three parts.
//   Scheduler  what the CTA computes, from its block index: work(params),
//              the CTA's work item (the forward's: a query block and the key
//              tiles it visits, fwd/sm80/scheduler.cuh; the backward's: a key
//              block and the query blocks that see it, bwd/scheduler.cuh);
//   Mainloop   the computation (<family>/sm80/mainloop.cuh). Constructed from shared
//              memory (the thread's place in the CTA), bind(params, work)
//              binds it to the item's operands and says whether there is
//              anything to compute; run(params, work, finish) computes and
//              calls finish(...) with the results in registers, while they
//              are in scope;
//   Epilogue   where results go: store_empty(params, work, tid) for an item
//              with nothing to compute, and store(params, mainloop,
//              results..., smem), called as run's finish with the results
//              run hands it (<family>/sm80/epilogue.cuh).
#pragma once

namespace flashcore {
namespace sm80 {

template <typename Mainloop, typename Epilogue, typename Scheduler>
struct KernelShell {
    // p: the kernel's parameters; smem: its dynamic shared memory.
    template <typename Params>
    __device__ __forceinline__ static void run(const Params &p, unsigned char *smem) {
        Mainloop mainloop(smem);
        const typename Scheduler::Work work = Scheduler::work(p);
        if (!mainloop.bind(p, work)) {
            Epilogue::store_empty(p, work, mainloop.tid);
            return;
        }
        mainloop.run(p, work, [&](auto &...results) { Epilogue::store(p, mainloop, results..., smem); });
    }
};

}  // namespace sm80
}  // namespace flashcore
