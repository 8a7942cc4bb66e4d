"""The processes of a job and their listening TCP ports, from /proc (Linux):
the descendants of the launcher, each process's socket inodes (/proc/PID/fd)
matched against the LISTEN entries of /proc/net/tcp and tcp6."""

import os


def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(root):
    """root and every process below it."""
    kids = children_map()
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


def listening_sockets():
    """{inode: port} of every TCP socket in LISTEN state (IPv4 and IPv6)."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":
                        out[int(parts[9])] = int(parts[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    return out


def tcp_table():
    """[(local port, remote port, state, inode)] of every TCP socket."""
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    out.append((int(parts[1].rsplit(":", 1)[1], 16),
                                int(parts[2].rsplit(":", 1)[1], 16), parts[3], int(parts[9])))
        except OSError:
            continue
    return out


def connected_to(port, pids):
    """The job processes (pids) holding an established connection to `port`."""
    table = tcp_table()
    remote_ports = {r for l, r, st, _ in table if l == port and st == "01"}
    peer_inodes = {i for l, r, st, i in table if l in remote_ports and r == port and st == "01"}
    return sorted(pid for pid in pids if socket_inodes(pid) & peer_inodes)


def listeners(pids):
    """{(pid, port)} of the given processes' listening sockets."""
    listen = listening_sockets()
    found = set()
    for pid in pids:
        for inode in socket_inodes(pid):
            if inode in listen:
                found.add((pid, listen[inode]))
    return found


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def identity(pid, launcher_pid):
    """(role, rank) a job process proves in its hellos."""
    if pid == launcher_pid:
        return "scheduler", 0
    env = environ(pid)
    role = env.get("PUSHPULL_ROLE") or env.get("DMLC_ROLE") or "worker"
    return role, int(env.get("PUSHPULL_RANK", env.get("RANK", "0")))


def label(pid, launcher_pid):
    if pid == launcher_pid:
        return "launcher"
    env = environ(pid)
    role = env.get("PUSHPULL_ROLE") or env.get("DMLC_ROLE")
    rank = env.get("PUSHPULL_RANK", "?")
    return f"{role} {rank}" if role else f"pid {pid}"
