package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The deployment files, relative to this package.
const (
	deployK8s    = "../../deploy/k8s"
	deploySlurm  = "../../deploy/slurm"
	deployDocker = "../../Dockerfile"
	deployDoc    = "../../docs/deploy.md"
)

// k8sObject is the part of a manifest the test reads.
type k8sObject struct {
	Kind     string
	Metadata struct{ Name string }
	Spec     struct {
		// Service
		ClusterIP                string         `yaml:"clusterIP"`
		PublishNotReadyAddresses bool           `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]any // a Service's labels; a StatefulSet's matchLabels
		Ports                    []k8sPort
		// StatefulSet
		ServiceName         string `yaml:"serviceName"`
		Replicas            int
		PodManagementPolicy string `yaml:"podManagementPolicy"`
		Template            struct {
			Metadata struct{ Labels map[string]string }
			Spec     struct {
				SecurityContext struct {
					RunAsUser int `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []k8sContainer
				Volumes    []struct {
					Name   string
					Secret *struct {
						SecretName string `yaml:"secretName"`
					}
				}
			}
		}
		VolumeClaimTemplates []struct{ Metadata struct{ Name string } } `yaml:"volumeClaimTemplates"`
	}
}

type k8sPort struct {
	Port          int
	ContainerPort int `yaml:"containerPort"`
	Protocol      string
}

type k8sContainer struct {
	Image string
	Args  []string
	Env   []struct {
		Name      string
		ValueFrom struct {
			FieldRef struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	}
	Ports        []k8sPort
	VolumeMounts []struct {
		Name      string
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// readManifests decodes every document of every YAML file in dir.
func readManifests(t *testing.T, dir string) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	var objs []k8sObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// TestKubernetesManifests checks deploy/k8s against gyre itself: every
// flag the StatefulSet passes is one `gyre --help` or `gyre train --help`
// lists, the arguments parse and make a valid worker config, and the
// manifests agree with each other and with docs/deploy.md: the seeds name
// every pod, pod 0's first, through the headless service; --min-workers
// is the replica count; the key file and the checkpoint directory are on
// the secret and the claimed volume; the ports are open.
func TestKubernetesManifests(t *testing.T) {
	objs := readManifests(t, deployK8s)
	var svc, sts *k8sObject
	for i := range objs {
		switch objs[i].Kind {
		case "Service":
			svc = &objs[i]
		case "StatefulSet":
			sts = &objs[i]
		}
	}
	if svc == nil || sts == nil {
		t.Fatalf("%s: want a Service and a StatefulSet, got %d objects", deployK8s, len(objs))
	}
	if svc.Spec.ClusterIP != "None" || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("service %s: clusterIP %q, publishNotReadyAddresses %v; want a headless service (None) that publishes pods before they are ready",
			svc.Metadata.Name, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if sts.Spec.ServiceName != svc.Metadata.Name {
		t.Errorf("the StatefulSet's serviceName %q is not the service %q", sts.Spec.ServiceName, svc.Metadata.Name)
	}
	for k, v := range svc.Spec.Selector {
		if sts.Spec.Template.Metadata.Labels[k] != fmt.Sprint(v) {
			t.Errorf("the service selects %s=%s, which the pods do not carry", k, v)
		}
	}
	if sts.Spec.PodManagementPolicy != "Parallel" {
		t.Errorf("podManagementPolicy %q: want Parallel, so that no pod waits for another to be ready", sts.Spec.PodManagementPolicy)
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("the StatefulSet has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	// $(VAR) in args is expanded by Kubernetes only from the container's env.
	vars := map[string]string{}
	for _, e := range c.Env {
		vars[e.Name] = "env-" + e.Name
		if e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
			vars[e.Name] = "10.1.2.3"
		}
	}
	var args []string
	for _, a := range c.Args {
		args = append(args, regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(a, func(m string) string {
			name := m[2 : len(m)-1]
			v, ok := vars[name]
			if !ok {
				t.Errorf("args use %s, which the container's env does not define", m)
			}
			return v
		}))
	}
	flags := checkTrainArgs(t, "deploy/k8s StatefulSet", args)

	gossipPort := portOf(flags["--listen"])
	if gossipPort == 0 {
		t.Fatalf("--listen %q: want host:port", flags["--listen"])
	}
	if host, _, _ := strings.Cut(flags["--listen"], ":"); host != "10.1.2.3" {
		t.Errorf("--listen %q: want the pod's IP (status.podIP) and the gossip port", flags["--listen"])
	}
	var want []string
	for i := range sts.Spec.Replicas {
		want = append(want, fmt.Sprintf("%s-%d.%s:%d", sts.Metadata.Name, i, svc.Metadata.Name, gossipPort))
	}
	if got := strings.Split(flags["--seed"], ","); !slices.Equal(got, want) {
		t.Errorf("--seed %v: want every pod through the headless service, pod 0 first: %v", got, want)
	}
	if flags["--min-workers"] != strconv.Itoa(sts.Spec.Replicas) {
		t.Errorf("--min-workers %s: want the replica count %d, so that a job restarted whole waits for every checkpoint",
			flags["--min-workers"], sts.Spec.Replicas)
	}

	mounts := map[string]string{} // mount path → volume
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	secretName := ""
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Name == mounts[path.Dir(flags["--key-file"])] {
			secretName = v.Secret.SecretName
		}
	}
	if secretName == "" {
		t.Errorf("--key-file %s is not on a volume from a Secret", flags["--key-file"])
	} else if doc, err := os.ReadFile(deployDoc); err != nil {
		t.Error(err)
	} else if create := "kubectl create secret generic " + secretName + " --from-file=" + path.Base(flags["--key-file"]) + "="; !strings.Contains(string(doc), create) {
		t.Errorf("docs/deploy.md does not show how to create the secret the pods mount (%q)", create)
	}
	claimed := false
	for _, v := range sts.Spec.VolumeClaimTemplates {
		claimed = claimed || v.Metadata.Name == mounts[flags["--checkpoint-dir"]]
	}
	if !claimed {
		t.Errorf("--checkpoint-dir %s is not a volume claimed per pod (volumeClaimTemplates)", flags["--checkpoint-dir"])
	}
	if pod.SecurityContext.RunAsUser != dockerUser(t) {
		t.Errorf("the pods run as user %d, the image as %d", pod.SecurityContext.RunAsUser, dockerUser(t))
	}

	dataPort := gossipPort + 1 // DataAddr's default: the gossip port + 1
	for _, p := range []k8sPort{{Port: gossipPort, Protocol: "TCP"}, {Port: gossipPort, Protocol: "UDP"}, {Port: dataPort, Protocol: "UDP"}, {Port: dataPort, Protocol: "TCP"}} {
		if !slices.ContainsFunc(svc.Spec.Ports, func(q k8sPort) bool { return q.Port == p.Port && q.Protocol == p.Protocol }) {
			t.Errorf("the service does not open %d/%s", p.Port, p.Protocol)
		}
		if !slices.ContainsFunc(c.Ports, func(q k8sPort) bool { return q.ContainerPort == p.Port && q.Protocol == p.Protocol }) {
			t.Errorf("the container does not declare %d/%s", p.Port, p.Protocol)
		}
	}
}

// TestSlurmScript checks deploy/slurm: the batch script runs one task per
// node, each the worker script with the batch script's arguments. The
// worker script is run, with fakes of scontrol, getent and gyre, in the
// environment Slurm 22.05 gives the batch job's step and in the one it
// gives a step started later inside the job (`srun --jobid J --overlap
// -N1 -w n2`, docs/deploy.md's restart), as read off a real Slurm. Both
// must pass gyre train every node as a seed and the allocation's node
// count, and the flags must be those gyre train --help lists and make a
// valid worker config. A worker that exits 0 leaves the marker the batch
// script reads; one that fails leaves none and passes on its status.
func TestSlurmScript(t *testing.T) {
	batch, err := os.ReadFile(filepath.Join(deploySlurm, "gyre.sbatch"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(batch), "#SBATCH --ntasks-per-node=1") {
		t.Error("gyre.sbatch does not ask for one task per node: workers on one node would bind the same ports")
	}
	if !regexp.MustCompile(`(?m)^\s*deploy/slurm/gyre-worker\.sh "\$@"`).Match(batch) {
		t.Error(`gyre.sbatch does not run deploy/slurm/gyre-worker.sh "$@"`)
	}
	script, err := filepath.Abs(filepath.Join(deploySlurm, "gyre-worker.sh"))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	fakes := map[string]string{
		// scontrol show hostnames n[1-3]
		"scontrol": `[ "$1 $2" = "show hostnames" ] || exit 9
case "$3" in
*\[*) p=${3%%[*}; r=${3#*[}; r=${r%]}; for i in $(seq "${r%-*}" "${r#*-}"); do echo "$p$i"; done ;;
*) echo "$3" ;;
esac`,
		"getent": `[ "$1 $2" = "ahostsv4 n2" ] && echo "10.0.0.2        STREAM n2"`,
		// FAKE_GYRE_WAIT: run until SIGTERM, then leave (exit 0), as gyre does.
		"gyre": `if [ -n "${FAKE_GYRE_WAIT:-}" ]; then trap 'exit 0' TERM; sleep 60 & fi
printf '%s\n' "$@" >gyre.args.tmp && mv gyre.args.tmp gyre.args
wait
exit "${FAKE_GYRE_EXIT:-0}"`,
	}
	for name, body := range fakes {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	steps := map[string][]string{
		"batch step": {"SLURM_JOB_NODELIST=n[1-3]", "SLURM_NODELIST=n[1-3]", "SLURM_JOB_NUM_NODES=3", "SLURM_NNODES=3"},
		"restart":    {"SLURM_JOB_NODELIST=n2", "SLURM_NODELIST=n[1-3]", "SLURM_NNODES=1", "SLURM_STEP_NODELIST=n2"},
	}
	for name, env := range steps {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(script, "--iters", "500")
			cmd.Dir = dir
			cmd.Env = append([]string{"PATH=" + bin + ":" + os.Getenv("PATH"), "SLURM_JOB_ID=42", "SLURMD_NODENAME=n2"}, env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("gyre-worker.sh: %v\n%s", err, out)
			}
			b, err := os.ReadFile(filepath.Join(dir, "gyre.args"))
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Fields(string(b))
			flags := checkTrainArgs(t, "deploy/slurm/gyre-worker.sh", args)
			if want := "n1:7946,n2:7946,n3:7946"; flags["--seed"] != want || flags["--min-workers"] != "3" || flags["--listen"] != "10.0.0.2:7946" {
				t.Errorf("--seed %q --min-workers %q --listen %q: want every node (%s), their count (3) and the node's address",
					flags["--seed"], flags["--min-workers"], flags["--listen"], want)
			}
			if args[len(args)-2] != "--iters" || args[len(args)-1] != "500" {
				t.Errorf("the script's arguments are not passed last, to override its own: %q", args)
			}
			if _, err := os.Stat(filepath.Join(dir, ".gyre-finished-42")); err != nil {
				t.Errorf("a worker that exited 0 left no marker for gyre.sbatch: %v", err)
			}
		})
	}
	dir := t.TempDir()
	cmd := exec.Command(script)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + bin + ":" + os.Getenv("PATH"), "SLURM_JOB_ID=42", "SLURMD_NODENAME=n2", "FAKE_GYRE_EXIT=75"}, steps["restart"]...)
	var exit *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &exit) || exit.ExitCode() != 75 {
		t.Errorf("gyre-worker.sh of a worker that exits 75: %v, want exit status 75", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".gyre-finished-42")); err == nil {
		t.Error("a worker that failed left the marker of a finished job")
	}

	// Slurm's SIGTERM (scancel) reaches the script: the worker leaves,
	// exits 0, and leaves no marker, as it did not finish the job.
	dir = t.TempDir()
	cmd = exec.Command(script)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + bin + ":" + os.Getenv("PATH"), "SLURM_JOB_ID=42", "SLURMD_NODENAME=n2", "FAKE_GYRE_WAIT=1"}, steps["restart"]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "gyre.args")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the fake gyre did not start within 10 s")
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("gyre-worker.sh asked to leave: %v, want exit status 0 (the worker left)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".gyre-finished-42")); err == nil {
		t.Error("a worker asked to leave left the marker of a finished job")
	}
}

// checkTrainArgs checks gyre arguments (global flags, "train", its flags)
// as a deployment file passes them: every flag is one that --help lists,
// `gyre ARGS --help` parses them, and they make a valid worker config. It
// returns the flags' values by name ("--seed").
func checkTrainArgs(t *testing.T, file string, args []string) map[string]string {
	t.Helper()
	at := slices.Index(args, "train")
	if at < 0 {
		t.Fatalf("%s: no train command in %q", file, args)
	}
	global, train := args[:at], args[at+1:]
	rootHelp, _, err := run(t, testEnv(nil), "--help")
	if err != nil {
		t.Fatal(err)
	}
	trainHelp, _, err := run(t, testEnv(nil), "train", "--help")
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{}
	for _, part := range []struct {
		args []string
		help []string
		cmd  string
	}{{global, helpFlags(rootHelp), "gyre --help"}, {train, helpFlags(trainHelp), "gyre train --help"}} {
		for i, a := range part.args {
			if !strings.HasPrefix(a, "-") {
				continue
			}
			name, value, ok := strings.Cut(a, "=")
			if !ok && i+1 < len(part.args) && !strings.HasPrefix(part.args[i+1], "-") {
				value = part.args[i+1]
			}
			if !slices.Contains(part.help, name) {
				t.Errorf("%s passes %s, which `%s` does not list", file, name, part.cmd)
			}
			values[name] = value
		}
	}
	if _, _, err := run(t, testEnv(nil), append(slices.Clone(args), "--help")...); err != nil {
		t.Errorf("%s: gyre does not parse its arguments %q: %v", file, args, err)
	}
	c := &cli{env: testEnv(nil)}
	cmd := newTrainCmd(c)
	if err := cmd.ParseFlags(train); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	cfg, err := c.workerConfig(cmd.Flags())
	if err == nil {
		err = cfg.WithDefaults().Validate()
	}
	if err != nil {
		t.Errorf("%s: the worker config its flags make is not valid: %v", file, err)
	}
	return values
}

// dockerUser returns the numeric user the Dockerfile's image runs as.
func dockerUser(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(deployDocker)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Dockerfile sets no numeric USER")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestDockerfileBuildsTheCommand checks that the Dockerfile builds the
// package the gyre command lives in and makes it the entry point: the
// image is not built here (no container daemon), so this is what can be
// checked.
func TestDockerfileBuildsTheCommand(t *testing.T) {
	b, err := os.ReadFile(deployDocker)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`go build .*-o (\S+) (\./\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Dockerfile runs no go build -o OUT ./PKG")
	}
	if filepath.Base(string(m[1])) != "gyre" || filepath.Clean(string(m[2])) != "cmd/gyre" {
		t.Errorf("the Dockerfile builds %s into %s; want ./cmd/gyre into gyre", m[2], m[1])
	}
	if !bytes.Contains(b, []byte(`ENTRYPOINT ["gyre"]`)) || !bytes.Contains(b, []byte("/usr/local/bin/gyre")) {
		t.Error("the image's entry point is not the gyre command on PATH")
	}
}
