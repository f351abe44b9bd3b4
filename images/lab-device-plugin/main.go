// lab-device-plugin advertises a lab GPU node's GPUs to its kubelet through the kubelet's device
// plugin API (v1beta1), as NVIDIA's device plugin does on a real GPU node: one device per GPU of the
// node's reading (the file NVML's answer stands in for in the lab), under nvidia.com/gpu, Unhealthy
// while the reading gives it an Xid error. A reading that changes (a GPU gone, a fault) is sent to
// the kubelet at once; a kubelet that restarts (it removes every socket in the plugin directory) is
// registered with again.
//
//	lab-device-plugin --reading FILE [--resource nvidia.com/gpu] [--dir /var/lib/kubelet/device-plugins]
//
// Allocate hands the container NVIDIA_VISIBLE_DEVICES as NVIDIA's plugin does; there is no device
// to mount. Built static (CGO_ENABLED=0) into a lab image by superkube.lab.images.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type gpu struct {
	UUID      string `json:"uuid"`
	XidErrors []int  `json:"xid_errors"`
}

type reading struct {
	GPUs []gpu `json:"gpus"`
}

type plugin struct {
	api.UnimplementedDevicePluginServer
	path    string
	mu      sync.Mutex
	devices []*api.Device
	changed chan struct{}
}

func (p *plugin) read() ([]*api.Device, error) {
	data, err := os.ReadFile(p.path)
	if err != nil {
		return nil, err
	}
	var r reading
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", p.path, err)
	}
	out := make([]*api.Device, 0, len(r.GPUs))
	for _, g := range r.GPUs {
		health := api.Healthy
		if len(g.XidErrors) > 0 {
			health = api.Unhealthy
		}
		out = append(out, &api.Device{ID: g.UUID, Health: health})
	}
	return out, nil
}

// refresh reads the reading again and wakes every ListAndWatch stream when the devices changed.
func (p *plugin) refresh() {
	devices, err := p.read()
	if err != nil {
		log.Printf("reading: %v (keeping %d devices)", err, len(p.current()))
		return
	}
	p.mu.Lock()
	same := sameDevices(devices, p.devices)
	p.devices = devices
	old := p.changed
	if !same {
		p.changed = make(chan struct{})
	}
	p.mu.Unlock()
	if !same {
		log.Printf("advertising %d devices (%d healthy)", len(devices), healthy(devices))
		close(old)
	}
}

// sameDevices compares what the kubelet is told (each device's ID and health), not the messages
// themselves: a sent protobuf message carries internal state a fresh one lacks.
func sameDevices(a, b []*api.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health {
			return false
		}
	}
	return true
}

func (p *plugin) current() []*api.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices
}

func healthy(devices []*api.Device) int {
	n := 0
	for _, d := range devices {
		if d.Health == api.Healthy {
			n++
		}
	}
	return n
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	for {
		p.mu.Lock()
		devices, changed := p.devices, p.changed
		p.mu.Unlock()
		if err := stream.Send(&api.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	out := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		out.ContainerResponses = append(out.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return out, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

// serve listens on the plugin's socket and registers it with the kubelet; it returns the server once
// the kubelet has accepted it.
func serve(p *plugin, dir, socket, resource string) (*grpc.Server, error) {
	path := filepath.Join(dir, socket)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: socket, ResourceName: resource,
	})
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("registering with the kubelet: %w", err)
	}
	return server, nil
}

func main() {
	path := flag.String("reading", "", "the node's GPU reading (JSON with gpus[].uuid and gpus[].xid_errors)")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource to advertise")
	dir := flag.String("dir", api.DevicePluginPath, "the kubelet's device plugin directory")
	every := flag.Duration("interval", 5*time.Second, "how often the reading and the registration are checked")
	flag.Parse()
	if *path == "" {
		fmt.Fprintln(os.Stderr, "lab-device-plugin: --reading FILE is required")
		os.Exit(2)
	}
	p := &plugin{path: *path, changed: make(chan struct{})}
	socket := "superkube-lab-gpu.sock"
	var server *grpc.Server
	for {
		p.refresh()
		if _, err := os.Stat(filepath.Join(*dir, socket)); server != nil && err != nil {
			log.Printf("our socket is gone (the kubelet restarted): registering again")
			server.Stop()
			server = nil
		}
		if server == nil {
			s, err := serve(p, *dir, socket, *resource)
			if err != nil {
				log.Printf("%v (trying again in %s)", err, *every)
			} else {
				server = s
				log.Printf("registered %s with the kubelet: %d devices", *resource, len(p.current()))
			}
		}
		time.Sleep(*every)
	}
}
