import Foundation
import XCTest

/// Requests served over FUSE-over-io_uring (the fuse module's `enable_uring`, which the test
/// turns on for its mounts and puts back).
final class TransportTests: MountTestCase {
    private static let parameter = "/sys/module/fuse/parameters/enable_uring"

    /// Everyday operations through the rings, with one thread per CPU and every process on one
    /// CPU: lock requests that wait hold that thread's ring entries, and the CPU's other
    /// requests still get answered (the thread registers more); each waiter is answered when
    /// the lock comes free, by whichever thread frees it.
    func testRequestsAreServedThroughTheRings() throws {
        guard let before = Posix.readText(Self.parameter)?.trimmingCharacters(in: .whitespacesAndNewlines) else {
            // A kernel without FUSE over io_uring: the option changes nothing.
            try mount(extra: ["--io-uring-threads", "1"])
            XCTAssertEqual(assertShell("echo x > f && cat f", cwd: docs("SugoiApp")).stdout, "x\n")
            try unmount()
            XCTAssertFalse(daemonLogTail(lines: 1000).contains("io_uring"), daemonLogTail())
            return
        }
        XCTAssertEqual(Posix.writeFile(Self.parameter, "Y\n"), 0)
        defer { Posix.writeFile(Self.parameter, before + "\n") }
        try mount(extra: ["--io-uring-threads", "1"])
        let script = """
        import fcntl, os, subprocess, sys, time
        os.sched_setaffinity(0, {0})
        data = os.urandom(3 << 20)
        with open("big", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        open("/proc/sys/vm/drop_caches", "w").write("3")
        print("read back", open("big", "rb").read() == data)
        os.rename("big", "moved")
        os.setxattr("moved", "user.tag", b"blue")
        print("xattr", os.getxattr("moved", "user.tag"), "user.tag" in os.listxattr("moved"))
        os.truncate("moved", 10)
        print("size", os.stat("moved").st_size)
        holder = open("locked", "w")
        fcntl.flock(holder, fcntl.LOCK_EX)
        waiter = "import fcntl, os; os.sched_setaffinity(0, {0}); f = open('locked'); fcntl.flock(f, fcntl.LOCK_EX); print('got', flush=True)"
        children = [subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True) for _ in range(3)]
        time.sleep(0.5)
        print("waiting", sum(c.poll() is None for c in children))
        for i in range(20):
            open("n%d" % i, "w").write(str(i))
        print("while waiting", sorted(n for n in os.listdir(".") if n.startswith("n")) == sorted("n%d" % i for i in range(20)))
        fcntl.flock(holder, fcntl.LOCK_UN)
        print("waiters", [c.communicate(timeout=30)[0].strip() for c in children])
        for n in os.listdir("."):
            os.unlink(n)
        print("left", os.listdir("."))
        """
        let r = assertShell("python3 -c \(shellQuote(script))", cwd: docs("SugoiApp"))
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init), [
            "read back True", "xattr b'blue' True", "size 10", "waiting 3", "while waiting True",
            "waiters ['got', 'got', 'got']", "left []",
        ])
        try unmount()
        let log = daemonLogTail(lines: 1000)
        XCTAssertTrue(log.contains("requests are served over io_uring"), log)
        let carried = log.split(separator: "\n").compactMap { line -> Int? in
            guard let range = line.range(of: "io_uring carried ") else { return nil }
            return Int(line[range.upperBound...].prefix { $0.isNumber })
        }
        XCTAssertGreaterThan(carried.last ?? 0, 100, "the rings carried the requests: \(log)")
        XCTAssertFalse(log.contains("refused") || log.contains("no ring entry left"), log)
    }

    /// `--io-uring-threads 0` keeps every request on /dev/fuse even where rings are offered;
    /// a bad count is a usage error.
    func testZeroThreadsKeepsDevFuse() throws {
        XCTAssertEqual(ubiquityfs(["mount", "--io-uring-threads", "65", mountPoint]).status, 64)
        XCTAssertEqual(ubiquityfs(["mount", "--io-uring-threads", "many", mountPoint]).status, 64)
        let before = Posix.readText(Self.parameter)?.trimmingCharacters(in: .whitespacesAndNewlines)
        if before != nil { XCTAssertEqual(Posix.writeFile(Self.parameter, "Y\n"), 0) }
        defer { if let before { Posix.writeFile(Self.parameter, before + "\n") } }
        try mount(extra: ["--io-uring-threads", "0"])
        XCTAssertEqual(assertShell("echo x > f && cat f && rm f", cwd: docs("SugoiApp")).stdout, "x\n")
        try unmount()
        XCTAssertFalse(daemonLogTail(lines: 1000).contains("io_uring"), daemonLogTail())
    }
}
