/* engine_vulkan.cpp — dpar inside an engine that owns its Vulkan device and a frame budget.

   What a game or simulation engine does: it creates its own VkInstance, VkDevice and queue (here a
   Vulkan 1.2 device with timelineSemaphore on), hands them to dpar (desc.vulkan.external, with a
   lock around the shared queue), and trains a model a little every frame: a step of the digits MLP
   graph (64 -> hidden -> 10, SGD) is started with dpar_graph_run_start and polled with dpar_test, so
   no frame waits for the GPU. Every few steps the renderer takes the second layer's weights straight
   from dpar's VkBuffer (dpar_vulkan_buffer_export): a vkCmdCopyBuffer into an engine-owned
   host-visible buffer, submitted on the engine's queue waiting for the export's ready value and
   signalling its release value, then dpar_vulkan_buffer_release; the next training step's GPU work
   waits for that copy, the host never does. The frame time spent in dpar calls is measured against a
   budget it prints; at the end the last copy must equal dpar_array_get of the weights, bit for bit.

   tests/test_engine_vulkan.sh runs it on llvmpipe under the Khronos validation layer with
   synchronization validation, expecting no message. Usage (from the repository root):
       engine_vulkan [--steps N] [--devices N] [--budget-ms MS] [--data path]  */
#include "dpar.h"
#include "example_util.h" // ex_parse (the flags), ex_csv_row (the data's rows)

#include <vulkan/vulkan.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr int kPix = 64, kClass = 10, kHidden = 32, kBatch = 64;

bool ok(dpar_status s, const char *what) {
    if (s == DPAR_OK) return true;
    std::fprintf(stderr, "engine_vulkan: %s: %s: %s\n", what, dpar_status_string(s), dpar_last_error());
    return false;
}
bool vk_ok(VkResult r, const char *what) {
    if (r == VK_SUCCESS) return true;
    std::fprintf(stderr, "engine_vulkan: %s failed: VkResult %d\n", what, (int)r);
    return false;
}
double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The UCI digits (examples/data/digits.csv.gz): 64 pixels 0..16 and a label per line. False after
// printing what is wrong: a directory, the file cannot be opened, a line and field are malformed, or no rows.
bool load_digits(const char *path, std::vector<float> &x, std::vector<int32_t> &y) {
    if (ex_check_data_file("engine_vulkan", path)) return false;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        std::fprintf(stderr,
                     "engine_vulkan: cannot open '%s': %s (run from the repository root, or give --data PATH)\n", path,
                     errno ? std::strerror(errno) : "out of memory");
        return false;
    }
    char line[1024];
    long line_no = 0;
    bool good = true;
    while (good && gzgets(f, line, sizeof line)) {
        line_no++;
        if (!line[std::strspn(line, " \t\r\n")]) continue; // a blank line
        float px[kPix];
        int32_t label = 0;
        good = ex_csv_row("engine_vulkan", path, line_no, line, kPix + 1, 16, kClass - 1, 16.0f, px, &label) == 0;
        if (good) {
            x.insert(x.end(), px, px + kPix);
            y.push_back(label);
        }
    }
    gzclose(f);
    if (good && y.empty()) std::fprintf(stderr, "engine_vulkan: %s holds no rows of 64 pixels and a label\n", path);
    return good && !y.empty();
}

// The engine's Vulkan objects, created as an engine would, before dpar exists.
struct Engine {
    VkInstance inst = VK_NULL_HANDLE;
    VkPhysicalDevice pd = VK_NULL_HANDLE;
    VkDevice dev = VK_NULL_HANDLE;
    VkQueue queue = VK_NULL_HANDLE;
    uint32_t family = 0;
    std::mutex queue_mutex; // the engine's render thread and dpar's workers share `queue`
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkBuffer readback = VK_NULL_HANDLE; // what the renderer reads: host-visible, engine-owned
    VkDeviceMemory readback_mem = VK_NULL_HANDLE;
    float *readback_map = nullptr;
};

// 0: created; 77: no Vulkan driver or device (the test script's "skipped"); 1: another failure.
int engine_create(Engine &e, size_t readback_bytes) {
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "engine_vulkan";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ici{};
    ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ici.pApplicationInfo = &app;
    if (!vk_ok(vkCreateInstance(&ici, nullptr, &e.inst), "vkCreateInstance (no Vulkan 1.2 driver?)")) return 77;
    uint32_t n = 1;
    VkResult r = vkEnumeratePhysicalDevices(e.inst, &n, &e.pd);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || n == 0) {
        std::fprintf(stderr, "engine_vulkan: no Vulkan physical device\n");
        return 77;
    }
    uint32_t nf = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(e.pd, &nf, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nf);
    vkGetPhysicalDeviceQueueFamilyProperties(e.pd, &nf, qf.data());
    e.family = nf;
    for (uint32_t i = 0; i < nf && e.family == nf; i++) // an engine's main queue: graphics and compute
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && (qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) e.family = i;
    if (e.family == nf) {
        std::fprintf(stderr, "engine_vulkan: the device has no graphics + compute queue family\n");
        return 1;
    }
    VkPhysicalDeviceVulkan12Features f12{};
    f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    f12.timelineSemaphore = VK_TRUE; // dpar_vulkan_buffer_export's synchronization contract
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci{};
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = e.family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci{};
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.pNext = &f12;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    if (!vk_ok(vkCreateDevice(e.pd, &dci, nullptr, &e.dev), "vkCreateDevice (timelineSemaphore)")) return 1;
    vkGetDeviceQueue(e.dev, e.family, 0, &e.queue);

    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = e.family;
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    if (!vk_ok(vkCreateCommandPool(e.dev, &pci, nullptr, &e.pool), "vkCreateCommandPool")) return 1;
    cai.commandPool = e.pool;
    if (!vk_ok(vkAllocateCommandBuffers(e.dev, &cai, &e.cb), "vkAllocateCommandBuffers")) return 1;
    if (!vk_ok(vkCreateFence(e.dev, &fci, nullptr, &e.fence), "vkCreateFence")) return 1;

    VkBufferCreateInfo bci{};
    bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bci.size = readback_bytes;
    bci.usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    if (!vk_ok(vkCreateBuffer(e.dev, &bci, nullptr, &e.readback), "vkCreateBuffer")) return 1;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(e.dev, e.readback, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(e.pd, &mp);
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = 0;
    while (type < mp.memoryTypeCount &&
           !((req.memoryTypeBits >> type & 1u) && (mp.memoryTypes[type].propertyFlags & want) == want))
        type++;
    VkMemoryAllocateInfo mai{};
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = type;
    if (type == mp.memoryTypeCount || !vk_ok(vkAllocateMemory(e.dev, &mai, nullptr, &e.readback_mem), "memory"))
        return 1;
    if (!vk_ok(vkBindBufferMemory(e.dev, e.readback, e.readback_mem, 0), "vkBindBufferMemory")) return 1;
    void *map = nullptr;
    if (!vk_ok(vkMapMemory(e.dev, e.readback_mem, 0, VK_WHOLE_SIZE, 0, &map), "vkMapMemory")) return 1;
    e.readback_map = static_cast<float *>(map);
    return 0;
}

void engine_destroy(Engine &e) {
    if (e.dev) {
        vkDeviceWaitIdle(e.dev);
        vkDestroyBuffer(e.dev, e.readback, nullptr);
        vkFreeMemory(e.dev, e.readback_mem, nullptr);
        vkDestroyFence(e.dev, e.fence, nullptr);
        vkDestroyCommandPool(e.dev, e.pool, nullptr);
        vkDestroyDevice(e.dev, nullptr);
    }
    if (e.inst) vkDestroyInstance(e.inst, nullptr);
}

// The renderer takes dpar's buffer on the GPU: wait for the export's ready value, copy into the
// engine's buffer, make it visible to the host, signal the release value. Fence: e.fence.
bool engine_copy_from(Engine &e, const dpar_vulkan_export &ex) {
    VkBuffer src;
    VkSemaphore sem;
    std::memcpy(&src, &ex.buffer, sizeof src);
    std::memcpy(&sem, &ex.semaphore, sizeof sem);
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (!vk_ok(vkResetCommandBuffer(e.cb, 0), "vkResetCommandBuffer")) return false;
    if (!vk_ok(vkBeginCommandBuffer(e.cb, &bi), "vkBeginCommandBuffer")) return false;
    VkBufferCopy region{ ex.offset, 0, ex.size };
    vkCmdCopyBuffer(e.cb, src, e.readback, 1, &region);
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(e.cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0,
                         nullptr);
    if (!vk_ok(vkEndCommandBuffer(e.cb), "vkEndCommandBuffer")) return false;
    VkTimelineSemaphoreSubmitInfo ti{};
    ti.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
    ti.waitSemaphoreValueCount = 1;
    ti.pWaitSemaphoreValues = &ex.ready_value;
    ti.signalSemaphoreValueCount = 1;
    ti.pSignalSemaphoreValues = &ex.release_value;
    VkPipelineStageFlags stage = VK_PIPELINE_STAGE_TRANSFER_BIT;
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.pNext = &ti;
    si.waitSemaphoreCount = 1;
    si.pWaitSemaphores = &sem;
    si.pWaitDstStageMask = &stage;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &e.cb;
    si.signalSemaphoreCount = 1;
    si.pSignalSemaphores = &sem;
    if (!vk_ok(vkResetFences(e.dev, 1, &e.fence), "vkResetFences")) return false;
    std::lock_guard<std::mutex> lock(e.queue_mutex);
    return vk_ok(vkQueueSubmit(e.queue, 1, &si, e.fence), "vkQueueSubmit");
}

// The training step as a graph: feeds x [batch, 64] and y [batch] split over "data", the MLP, its
// gradient (pmean over "data" by the graph) and SGD on the replicated parameters.
struct Model {
    dpar_array *param[4] = {};
    dpar_graph *g = nullptr;
    dpar_value x{}, y{};
};
bool model_create(dpar_mesh *mesh, Model &m) {
    const int64_t shapes[4][2] = { { kPix, kHidden }, { kHidden, 0 }, { kHidden, kClass }, { kClass, 0 } };
    uint64_t rng = 42;
    for (int i = 0; i < 4; i++) {
        dpar_array_desc d{};
        d.dtype = DPAR_F32;
        d.ndim = shapes[i][1] ? 2 : 1;
        d.shape[0] = shapes[i][0];
        d.shape[1] = shapes[i][1];
        if (!ok(dpar_array_create(mesh, &d, &m.param[i]), "dpar_array_create")) return false;
        size_t n = (size_t)shapes[i][0] * (size_t)(shapes[i][1] ? shapes[i][1] : 1);
        std::vector<float> w(n, 0.0f);
        float bound = std::sqrt(6.0f / (float)shapes[i][0]);
        for (size_t k = 0; shapes[i][1] && k < n; k++) { // He-uniform weights (splitmix64), zero biases
            uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            w[k] = ((float)((z ^ (z >> 31)) >> 40) / 16777216.0f * 2.0f - 1.0f) * bound;
        }
        if (!ok(dpar_array_put(m.param[i], w.data()), "dpar_array_put")) return false;
    }
    if (!ok(dpar_graph_create(mesh, &m.g), "dpar_graph_create")) return false;
    dpar_array_desc xd{}, yd{};
    xd.dtype = DPAR_F32, xd.ndim = 2, xd.shape[0] = kBatch, xd.shape[1] = kPix, xd.spec[0] = "data";
    yd.dtype = DPAR_I32, yd.ndim = 1, yd.shape[0] = kBatch, yd.spec[0] = "data";
    m.x = dpar_g_feed(m.g, "x", &xd);
    m.y = dpar_g_feed(m.g, "y", &yd);
    const char *names[4] = { "w1", "b1", "w2", "b2" };
    dpar_value p[4], grads[4];
    for (int i = 0; i < 4; i++) p[i] = dpar_g_param(m.g, names[i], m.param[i]);
    dpar_value h = dpar_g_relu(m.g, dpar_g_bias_add(m.g, dpar_g_matmul(m.g, m.x, p[0], false, false), p[1]));
    dpar_value logits = dpar_g_bias_add(m.g, dpar_g_matmul(m.g, h, p[2], false, false), p[3]);
    dpar_sgd_desc sgd{};
    sgd.learning_rate = 0.1f;
    sgd.momentum = 0.9f;
    return ok(dpar_graph_value_and_grad(m.g, dpar_g_softmax_xent(m.g, logits, m.y), p, 4, grads), "value_and_grad") &&
           ok(dpar_graph_sgd(m.g, &sgd, p, grads, 4), "dpar_graph_sgd") &&
           ok(dpar_graph_compile(m.g, nullptr), "dpar_graph_compile"); // allocations: before the first frame
}

struct Options {
    int steps = 60, devices = 2;
    float budget_ms = 4.0f;
    const char *data = "examples/data/digits.csv.gz";
};
// 0, EX_HELP after --help, or 2 after printing what is wrong: an unknown flag or a malformed value (ex_parse, which lists the
// flags), or a value out of range, named with its limit.
int parse(int argc, char **argv, Options &o) {
    // --steps at least 2: step 1's loss is taken before its update, so one step cannot show the loss falling
    const ex_flag f[] = { EX_I("--steps", &o.steps, 2, INT_MAX), EX_I("--devices", &o.devices, 1, DPAR_MAX_DEVICES),
                          EX_F("--budget-ms", &o.budget_ms, "a finite number > 0"),
                          EX_S("--data", &o.data, "a CSV file, gzip'd or plain") };
    if (int rc = ex_parse("engine_vulkan", argc, argv, f, 4)) return rc;
    if (kBatch % o.devices) { // named here, not as the feed's shape error after the Vulkan setup
        std::fprintf(stderr,
                     "engine_vulkan: --devices %d must divide the batch of %d rows (each device gets whole rows)\n",
                     o.devices, kBatch);
        return 2;
    }
    if (!(o.budget_ms > 0.0f) || !std::isfinite(o.budget_ms)) {
        std::fprintf(stderr, "engine_vulkan: --budget-ms %g: must be a finite number > 0\n", (double)o.budget_ms);
        return 2;
    }
    return 0;
}

// Frame statistics: the time each frame spent in dpar and the engine's own submissions.
struct Frames {
    int count = 0, over = 0;
    double worst_ms = 0, total_ms = 0;
    void add(double ms, double budget) {
        count++, total_ms += ms, over += ms > budget;
        if (ms > worst_ms) worst_ms = ms;
    }
};

// The frame loop: start a step, poll it, and every `copy_every` finished steps hand the second layer's
// weights to the renderer through the exported VkBuffer. Returns false on an error.
bool run_frames(Engine &e, Model &m, const Options &o, const std::vector<float> &x, const std::vector<int32_t> &y,
                Frames &fr, float &first_loss, float &last_loss) {
    const int copy_every = 10, rows = (int)y.size();
    std::vector<float> xb((size_t)kBatch * kPix);
    std::vector<int32_t> yb(kBatch);
    dpar_request *req = nullptr;
    dpar_buffer *w2 = dpar_array_shard(m.param[2], 0); // device 0's replica of w2
    float loss = 0;
    int done_steps = 0;
    bool copy_pending = false;
    while (done_steps < o.steps || req || copy_pending) {
        double t0 = now_ms();
        if (copy_pending && vkGetFenceStatus(e.dev, e.fence) == VK_SUCCESS) copy_pending = false; // "drawn"
        if (req) {
            bool done = false;
            if (!ok(dpar_test(nullptr, req, &done), "dpar_test")) return false;
            if (done) {
                dpar_status s = dpar_wait(nullptr, req);
                req = nullptr;
                if (!ok(s, "training step")) return false;
                if (!std::isfinite(loss)) { // a diverged step never reaches the renderer as weights
                    std::fprintf(stderr, "engine_vulkan: the training loss is %g at step %d\n", (double)loss,
                                 done_steps + 1);
                    return false;
                }
                if (done_steps++ == 0) first_loss = loss;
                last_loss = loss;
                if ((done_steps % copy_every == 0 || done_steps == o.steps) && !copy_pending) {
                    dpar_vulkan_export ex;
                    if (!ok(dpar_vulkan_buffer_export(w2, &ex), "dpar_vulkan_buffer_export")) return false;
                    if (!engine_copy_from(e, ex)) return false;
                    if (!ok(dpar_vulkan_buffer_release(w2), "dpar_vulkan_buffer_release")) return false;
                    copy_pending = true;
                }
            }
        }
        if (!req && done_steps < o.steps) { // the next step; its GPU work waits for the renderer's copy
            for (int b = 0; b < kBatch; b++) {
                int row = (done_steps * kBatch + b * 7) % rows;
                std::memcpy(&xb[(size_t)b * kPix], &x[(size_t)row * kPix], kPix * sizeof(float));
                yb[(size_t)b] = y[(size_t)row];
            }
            dpar_graph_feed feeds[2] = { { m.x, xb.data(), nullptr }, { m.y, yb.data(), nullptr } };
            if (!ok(dpar_graph_run_start(m.g, feeds, 2, &loss, &req), "dpar_graph_run_start")) return false;
        }
        fr.add(now_ms() - t0, o.budget_ms);
        std::this_thread::sleep_for(std::chrono::milliseconds(1)); // the rest of the frame: rendering
    }
    return true;
}

void queue_lock(void *user) {
    static_cast<Engine *>(user)->queue_mutex.lock();
}
void queue_unlock(void *user) {
    static_cast<Engine *>(user)->queue_mutex.unlock();
}

} // namespace

int main(int argc, char **argv) {
    Options o;
    if (int rc = parse(argc, argv, o)) return ex_exit_status(rc);
    std::vector<float> x;
    std::vector<int32_t> y;
    if (!load_digits(o.data, x, y)) return 1; // it said why
    Engine e;
    const size_t w2_bytes = (size_t)kHidden * kClass * sizeof(float);
    int made = engine_create(e, w2_bytes);
    if (made) {
        engine_destroy(e);
        return made;
    }
    dpar_runtime_desc rd{};
    rd.backend = DPAR_BACKEND_VULKAN;
    rd.num_devices = o.devices; // logical dpar devices, all on the engine's one VkDevice and queue
    dpar_vulkan_external &ext = rd.vulkan.external;
    ext.instance = e.inst, ext.physical_device = e.pd, ext.device = e.dev, ext.queue = e.queue;
    ext.queue_family = e.family;
    ext.get_instance_proc_addr = reinterpret_cast<void (*)(void)>(vkGetInstanceProcAddr);
    ext.timeline_semaphore = true;
    ext.lock_queue = queue_lock, ext.unlock_queue = queue_unlock, ext.queue_user = &e;
    dpar_runtime *rt = nullptr;
    dpar_mesh *mesh = nullptr;
    dpar_mesh_desc md{};
    md.ndim = 1, md.shape[0] = o.devices, md.axis_names[0] = "data";
    Model m;
    Frames fr;
    float first = 0, last = 0;
    std::vector<float> w2(w2_bytes / sizeof(float));
    bool good = ok(dpar_runtime_create(&rd, &rt), "dpar_runtime_create") &&
                ok(dpar_mesh_create(rt, &md, &mesh), "dpar_mesh_create") && model_create(mesh, m) &&
                run_frames(e, m, o, x, y, fr, first, last) && ok(dpar_array_get(m.param[2], w2.data()), "get w2");
    if (good) {
        bool same = std::memcmp(w2.data(), e.readback_map, w2_bytes) == 0; // the copy is done: run_frames waited
        std::printf("engine: %s, %d logical dpar device(s) on the engine's VkDevice and queue\n", "adopted", o.devices);
        std::printf("frames: %d, budget %.2f ms for dpar per frame, worst %.3f ms, mean %.3f ms, %d over budget\n",
                    fr.count, o.budget_ms, fr.worst_ms, fr.total_ms / fr.count, fr.over);
        std::printf("steps: %d, loss %.4f -> %.4f\n", o.steps, (double)first, (double)last);
        std::printf("readback through the exported VkBuffer equals dpar_array_get(w2): %s\n", same ? "yes" : "NO");
        good = same && last < first;
        if (!same) std::fprintf(stderr, "engine_vulkan: the readback through the exported VkBuffer differs\n");
        if (!(last < first)) // a check that failed says so: the exit status alone said nothing
            std::fprintf(stderr, "engine_vulkan: the loss did not fall over %d steps (%g -> %g); try more --steps\n",
                         o.steps, (double)first, (double)last);
    }
    if (m.g) dpar_graph_destroy(m.g);
    for (dpar_array *a : m.param)
        if (a) dpar_array_destroy(a);
    dpar_runtime_destroy(rt); // dpar's own objects only: the engine's device is still ours
    engine_destroy(e);
    return good ? 0 : 1;
}
