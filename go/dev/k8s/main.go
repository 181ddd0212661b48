// Command kube is one binary for the Kubernetes components thaw's dev cluster
// runs (control/dev/cluster.py): kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet and kubectl from k8s.io/kubernetes at the pin
// (go.mod), each upstream's own cobra command. One binary links once: the
// five share most of their packages, and on a 2-core CI machine a link of
// Kubernetes is minutes (ci/build-cluster.sh). It dispatches on the name it
// is run as (build/kube-apiserver etc. are links to it), or on its first
// argument (`kube kubectl get nodes`), as hyperkube did before Kubernetes
// 1.17 removed it (kubernetes/kubernetes#83262).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // the API server's and controller-manager's CronJob time zones (their mains import it)

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins (its main imports them)
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format, as each main registers it
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// Each entry is the body of the upstream main at the pin (cmd/<name>/*.go).
var commands = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kubectl": func() int {
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err) // prints the error and exits non-zero
		}
		return 0
	},
}

func main() {
	name := filepath.Base(os.Args[0])
	run, ok := commands[name]
	if !ok && len(os.Args) > 1 {
		// `kube NAME ARGS...`: the command sees itself run as NAME (kubectl reads os.Args).
		if run, ok = commands[os.Args[1]]; ok {
			os.Args = os.Args[1:]
		}
	}
	if !ok {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "kube: run as one of %v (a link of that name, or the first argument)\n", names)
		os.Exit(2)
	}
	os.Exit(run())
}
