"""Every frame of some network namespaces, captured with raw AF_PACKET
sockets (ETH_P_ALL, one per namespace, every interface of it: the bridge's
ports in the hub, eth0 and lo in each host), and the TCP streams in them
put back together.

A socket belongs to the network namespace of the thread that creates it, so
the sockets are made after setns() into each namespace (libc's, through
ctypes: Python 3.11 has no os.setns) and the thread goes back to its own
namespace at once. One thread reads them all until stop(); parsing waits
for the end. A frame seen twice (sent and received on lo, or on both ends of
a veth) is one segment: segments are kept by (flow, sequence number).
"""

import ctypes
import os
import select
import socket
import struct
import threading

ETH_P_ALL = 0x0003
CLONE_NEWNET = 0x40000000
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_RCVBUFFORCE = 33
SYN, ACK = 0x02, 0x10

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f'setns: {os.strerror(e)}')


def packet_socket(ns):
    """A raw socket receiving every frame of network namespace `ns`
    (/run/netns/<ns>), all its interfaces."""
    own = os.open('/proc/thread-self/ns/net', os.O_RDONLY)
    target = os.open(f'/run/netns/{ns}', os.O_RDONLY)
    try:
        _setns(target)
        try:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    s.setblocking(False)
    return s


class Capture:
    """Frames of every namespace in `namespaces` from start() to stop()."""

    def __init__(self, namespaces):
        self.socks = {packet_socket(ns): ns for ns in namespaces}
        self.frames = []  # (namespace, interface, frame bytes)
        self.drops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _drain(self, s):
        ns = self.socks[s]
        while True:
            try:
                data, addr = s.recvfrom(1 << 18)
            except BlockingIOError:
                return
            self.frames.append((ns, addr[0], data))

    def _run(self):
        while not self._stop.is_set():
            ready, _, _ = select.select(list(self.socks), [], [], 0.05)
            for s in ready:
                self._drain(s)

    def stop(self):
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            self._drain(s)
            _packets, drops = struct.unpack('II', s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            self.drops += drops
            s.close()
        self.socks = {}
        return self


class Stream:
    """One direction of a TCP connection."""

    def __init__(self, flow):
        self.flow = flow  # (src, sport, dst, dport)
        self.isn = None   # from its SYN, when seen
        self.opened = False  # its SYN had no ACK: this side connected
        self.segments = {}  # sequence number -> payload
        self.data = b''
        self.gaps = 0

    def assemble(self):
        if not self.segments:
            return
        base = (self.isn + 1) & 0xffffffff if self.isn is not None else min(self.segments)
        out, at = bytearray(), 0
        for seq in sorted(self.segments, key=lambda q: (q - base) & 0xffffffff):
            off, payload = (seq - base) & 0xffffffff, self.segments[seq]
            if off > at:
                self.gaps += 1
                out += b'\0' * (off - at)  # keeps offsets; the gap is counted
                at = off
            if off + len(payload) > at:
                out += payload[at - off:]
                at = off + len(payload)
        self.data = bytes(out)


IP_PROTOCOLS = {1: 'icmp', 2: 'igmp', 6: 'tcp', 17: 'udp', 58: 'icmpv6'}


def _parse(frame):
    """(kind, src, dst, IP payload): kind 'tcp', 'udp', 'icmp', 'igmp',
    'icmpv6', 'arp', 'ip proto N' or 'ethertype 0xNNNN'. IPv6: past a
    hop-by-hop options header (the kernel's MLD reports)."""
    eth_type, ip = struct.unpack('!H', frame[12:14])[0], frame[14:]
    if eth_type == 0x8100:
        eth_type, ip = struct.unpack('!H', frame[16:18])[0], frame[18:]
    if eth_type == 0x0800 and len(ip) >= 20:
        ihl, total = (ip[0] & 0x0f) * 4, struct.unpack('!H', ip[2:4])[0]
        return (IP_PROTOCOLS.get(ip[9], f'ip proto {ip[9]}'),
                socket.inet_ntop(socket.AF_INET, ip[12:16]),
                socket.inet_ntop(socket.AF_INET, ip[16:20]), ip[ihl:total])
    if eth_type == 0x86dd and len(ip) >= 40:
        length, proto, at = struct.unpack('!H', ip[4:6])[0], ip[6], 40
        if proto == 0 and len(ip) >= 42:
            proto, at = ip[40], 40 + (ip[41] + 1) * 8
        return (IP_PROTOCOLS.get(proto, f'ip proto {proto}'),
                socket.inet_ntop(socket.AF_INET6, ip[8:24]),
                socket.inet_ntop(socket.AF_INET6, ip[24:40]), ip[at:40 + length])
    return ('arp' if eth_type == 0x0806 else f'ethertype {eth_type:#06x}'), None, None, b''


class Connection:
    def __init__(self, client, server):
        self.client, self.server = client, server  # Streams; client: sent the SYN

    def name(self):
        s, sp, d, dp = self.client.flow
        return f'{s}:{sp} -> {d}:{dp}'


def connections(frames):
    """The TCP connections in `frames`, each stream assembled, and the
    frames that were not TCP: {kind: count} (kinds as _parse())."""
    streams, other = {}, {}
    for _, _, frame in frames:
        kind, src, dst, tcp = _parse(frame)
        if kind != 'tcp':
            other[kind] = other.get(kind, 0) + 1
            continue
        sport, dport, seq = struct.unpack('!HHI', tcp[:8])
        flags, doff = tcp[13], (tcp[12] >> 4) * 4
        flow = (src, sport, dst, dport)
        st = streams.setdefault(flow, Stream(flow))
        if flags & SYN:
            st.isn, st.opened = seq, not flags & ACK
        payload = tcp[doff:]
        if payload and len(payload) > len(st.segments.get(seq, b'')):
            st.segments[seq] = payload
    conns, done = [], set()
    for flow, st in streams.items():
        rev = (flow[2], flow[3], flow[0], flow[1])
        key = frozenset((flow, rev))
        if key in done:
            continue
        done.add(key)
        back = streams.get(rev) or Stream(rev)
        st.assemble()
        back.assemble()
        # The client sent the SYN without ACK; without SYNs, guess the side
        # with the higher (ephemeral) port.
        if st.opened or back.opened:
            first = st if st.opened else back
        else:
            first = st if flow[1] > flow[3] else back
        conns.append(Connection(first, back if first is st else st))
    return conns, other
