// netload measures what a pod's network lets through, from inside the pod, with nothing but itself:
//
//	netload sink PORT          counts what each connection sends and, when the sender is done,
//	                           answers with the count and the address it came from:
//	                           {"bytes": N, "seconds": S, "peer": "IP"} (S: first to last byte)
//	netload send ADDR SECONDS  sends as fast as the network takes it for SECONDS, then prints the
//	                           sink's answer and writes it to /dev/termination-log, where the kubelet
//	                           reads a container's termination message into the pod's status
//
// The rate is the receiver's: bytes over the time between their first and last arrival, so a burst
// the sender's socket buffers absorb counts only once it is delivered. Built static (CGO_ENABLED=0)
// into a lab image by superkube.lab.images.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

const chunk = 256 << 10

type count struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Peer    string  `json:"peer"`
}

func fail(format string, args ...any) {
	msg := fmt.Sprintf("netload: "+format, args...)
	fmt.Fprintln(os.Stderr, msg)
	_ = os.WriteFile("/dev/termination-log", []byte(msg), 0o644)
	os.Exit(1)
}

func serve(conn net.Conn) {
	defer conn.Close()
	buf := make([]byte, chunk)
	var got count
	var first, last time.Time
	got.Peer, _, _ = net.SplitHostPort(conn.RemoteAddr().String())
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			last = time.Now()
			if got.Bytes == 0 {
				first = last
			}
			got.Bytes += int64(n)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "netload sink:", err)
			return
		}
	}
	got.Seconds = last.Sub(first).Seconds()
	_ = json.NewEncoder(conn).Encode(got)
}

func sink(port string) {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fail("listening on port %s: %v", port, err)
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			fail("accepting: %v", err)
		}
		go serve(conn)
	}
}

func send(addr string, seconds float64) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fail("connecting to %s: %v", addr, err)
	}
	buf := make([]byte, chunk)
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		if _, err := conn.Write(buf); err != nil {
			fail("sending to %s: %v", addr, err)
		}
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		fail("closing the send side: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Duration(seconds*float64(time.Second)) + 30*time.Second))
	var got count
	if err := json.NewDecoder(conn).Decode(&got); err != nil {
		fail("reading the sink's count from %s: %v", addr, err)
	}
	out, _ := json.Marshal(got)
	fmt.Println(string(out))
	_ = os.WriteFile("/dev/termination-log", out, 0o644)
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "sink" {
		sink(os.Args[2])
		return
	}
	if len(os.Args) == 4 && os.Args[1] == "send" {
		seconds, err := strconv.ParseFloat(os.Args[3], 64)
		if err != nil || seconds <= 0 {
			fail("SECONDS must be a positive number, not %q", os.Args[3])
		}
		send(os.Args[2], seconds)
		return
	}
	fail("usage: netload sink PORT | netload send ADDR SECONDS")
}
