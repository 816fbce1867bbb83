package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
)

// The Pod status the kubelet would report, computed from what the agent knows. The logic
// follows the kubelet's generateAPIPodStatus, getPhase and status/generate.go with v1.37's
// default feature gates; it is kept free of I/O so that it can be tested on its own.

// runView is one run (one "container" in CRI terms) of a container.
type runView struct {
	ID         string
	StartedAt  time.Time
	Exited     bool
	ExitCode   int32
	FinishedAt time.Time
	Message    string
}

// containerView is what the agent knows about one container of the spec.
type containerView struct {
	Waiting  *v1.ContainerStateWaiting // why it is not running (nil: the default reason)
	Current  *runView                  // the latest run; nil when it never ran
	Previous *runView                  // the run before Current
	Restarts int32
	Started  bool // while Current runs: the startup probe passed (or there is none)
	Ready    bool // while Current runs: the readiness probe passes (or there is none)
}

type podView struct {
	SandboxReady bool
	PodIP        string
	HostIP       string
	StartTime    time.Time
	Terminal     bool // the agent has finished the Pod: nothing will restart
	// Why the agent ended the Pod itself (its activeDeadlineSeconds passed): the Pod is
	// Failed with this reason and message, as the kubelet's eviction by a sync handler.
	FailReason, FailMessage string
	Containers              map[string]containerView // init and regular containers by name
}

// computePodStatus returns the kubelet-owned part of the status. old is the status last
// reported (for lastTransitionTime); pod.Status supplies what other components own.
func computePodStatus(pod *v1.Pod, old v1.PodStatus, view podView, now time.Time) v1.PodStatus {
	s := v1.PodStatus{HostIP: view.HostIP, ObservedGeneration: pod.Generation}
	if view.HostIP != "" {
		s.HostIPs = []v1.HostIP{{IP: view.HostIP}}
	}
	if view.PodIP != "" {
		s.PodIP = view.PodIP
		s.PodIPs = []v1.PodIP{{IP: view.PodIP}}
	}
	if !view.StartTime.IsZero() {
		t := metav1.NewTime(view.StartTime)
		s.StartTime = &t
	}
	hasInit := len(pod.Spec.InitContainers) > 0
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		s.InitContainerStatuses = append(s.InitContainerStatuses, containerStatus(c, view.Containers[c.Name], hasInit, true))
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		s.ContainerStatuses = append(s.ContainerStatuses, containerStatus(c, view.Containers[c.Name], hasInit, false))
	}
	sort.Sort(kubetypes.SortedContainerStatuses(s.ContainerStatuses))

	all := append(append([]v1.ContainerStatus{}, s.ContainerStatuses...), s.InitContainerStatuses...)
	s.Phase = podPhase(pod, all, view.Terminal, anyRegularRunning(pod, view))
	if view.FailReason != "" {
		s.Phase = v1.PodFailed // generateAPIPodStatus: a Pod a sync handler evicts is Failed
	}
	if p := pod.Status.Phase; p == v1.PodFailed || p == v1.PodSucceeded {
		s.Phase = p // a terminal phase never changes
	}
	switch {
	case view.FailReason != "" && s.Phase == v1.PodFailed:
		s.Reason, s.Message = view.FailReason, view.FailMessage
	case s.Phase == pod.Status.Phase:
		s.Reason, s.Message = pod.Status.Reason, pod.Status.Message
	}
	s.Conditions = podConditions(pod, s, view)
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = transitionTime(old, s.Conditions[i], now)
	}
	return s
}

func containerStatus(spec *v1.Container, cv containerView, hasInit, isInit bool) v1.ContainerStatus {
	st := v1.ContainerStatus{
		Name:         spec.Name,
		Image:        spec.Image,
		ImageID:      "servebook-agent://not-pulled/" + spec.Image,
		RestartCount: cv.Restarts,
		VolumeMounts: volumeMountStatuses(spec),
	}
	started := false
	cur := cv.Current
	switch {
	case cur == nil:
		st.State.Waiting = cv.Waiting
		if st.State.Waiting == nil {
			st.State.Waiting = &v1.ContainerStateWaiting{Reason: defaultWaitingReason(hasInit)}
		}
	case !cur.Exited:
		st.State.Running = &v1.ContainerStateRunning{StartedAt: metav1.NewTime(cur.StartedAt)}
		started = cv.Started
		st.Ready = started && cv.Ready && !(isInit && !podutil.IsRestartableInitContainer(spec))
	case cv.Waiting != nil: // exited; a restart is pending
		st.State.Waiting = cv.Waiting
		st.LastTerminationState.Terminated = terminatedState(cur)
	default:
		st.State.Terminated = terminatedState(cur)
		st.Ready = isInit && !podutil.IsRestartableInitContainer(spec) && cur.ExitCode == 0
	}
	st.Started = &started
	if cur != nil {
		st.ContainerID = cur.ID
		st.Resources = spec.Resources.DeepCopy()
		st.AllocatedResources = spec.Resources.Requests.DeepCopy()
		// Every process runs as root here.
		st.User = &v1.ContainerUser{Linux: &v1.LinuxContainerUser{SupplementalGroups: []int64{0}}}
		if st.LastTerminationState.Terminated == nil && cv.Previous != nil {
			st.LastTerminationState.Terminated = terminatedState(cv.Previous)
		}
	}
	return st
}

func defaultWaitingReason(hasInit bool) string {
	if hasInit {
		return "PodInitializing"
	}
	return "ContainerCreating"
}

func terminatedState(r *runView) *v1.ContainerStateTerminated {
	reason := "Completed"
	if r.ExitCode != 0 {
		reason = "Error"
	}
	return &v1.ContainerStateTerminated{
		ExitCode:    r.ExitCode,
		Reason:      reason,
		Message:     r.Message,
		StartedAt:   metav1.NewTime(r.StartedAt),
		FinishedAt:  metav1.NewTime(r.FinishedAt),
		ContainerID: r.ID,
	}
}

func volumeMountStatuses(c *v1.Container) []v1.VolumeMountStatus {
	var out []v1.VolumeMountStatus
	for _, m := range c.VolumeMounts {
		vs := v1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly}
		if m.ReadOnly {
			disabled := v1.RecursiveReadOnlyDisabled
			vs.RecursiveReadOnly = &disabled
		}
		out = append(out, vs)
	}
	return out
}

func anyRegularRunning(pod *v1.Pod, view podView) bool {
	for _, c := range pod.Spec.Containers {
		if r := view.Containers[c.Name].Current; r != nil && !r.Exited {
			return true
		}
	}
	return false
}

// podPhase is the kubelet's getPhase with ContainerRestartRules on (the v1.37 default).
func podPhase(pod *v1.Pod, info []v1.ContainerStatus, podIsTerminal, podHasInitialized bool) v1.PodPhase {
	pendingInit, pendingSidecars, failedInitNotRestartable := 0, 0, 0
	unknown, running, waiting, stopped, stoppedNotRestartable, succeeded := 0, 0, 0, 0, 0, 0
	for _, c := range pod.Spec.InitContainers {
		st, ok := podutil.GetContainerStatus(info, c.Name)
		if podutil.IsRestartableInitContainer(&c) {
			switch {
			case !ok:
				unknown++
			case st.State.Running != nil:
				if st.Started == nil || !*st.Started {
					pendingSidecars++
				}
				running++
			case st.State.Waiting != nil && st.LastTerminationState.Terminated == nil:
				pendingSidecars++
				waiting++
			}
			continue
		}
		term := lastTermination(st)
		switch {
		case !ok || st.State.Running != nil || term == nil:
			pendingInit++
		case term.ExitCode != 0 && !podutil.ContainerShouldRestart(c, pod.Spec, term.ExitCode):
			failedInitNotRestartable++
		}
	}
	for _, c := range pod.Spec.Containers {
		st, ok := podutil.GetContainerStatus(info, c.Name)
		term := lastTermination(st)
		switch {
		case !ok:
			unknown++
		case st.State.Running != nil:
			running++
		case term != nil:
			stopped++
			if !podutil.ContainerShouldRestart(c, pod.Spec, term.ExitCode) {
				stoppedNotRestartable++
			}
			if st.State.Terminated != nil && term.ExitCode == 0 {
				succeeded++
			}
		default:
			waiting++
		}
	}
	if failedInitNotRestartable > 0 {
		return v1.PodFailed
	}
	switch {
	case pendingInit > 0 || (pendingSidecars > 0 && !podHasInitialized), waiting > 0:
		return v1.PodPending
	case running > 0 && unknown == 0:
		return v1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		if podIsTerminal || stopped == stoppedNotRestartable {
			if stopped == succeeded {
				return v1.PodSucceeded
			}
			return v1.PodFailed
		}
		return v1.PodRunning // at least one container is being restarted
	}
	return v1.PodPending
}

// lastTermination is the state getPhase counts as the container's exit: terminated now, or
// waiting after a termination.
func lastTermination(st v1.ContainerStatus) *v1.ContainerStateTerminated {
	if st.State.Terminated != nil {
		return st.State.Terminated
	}
	if st.State.Waiting != nil {
		return st.LastTerminationState.Terminated
	}
	return nil
}

// podConditions keeps the conditions other components own and adds the kubelet's.
func podConditions(pod *v1.Pod, s v1.PodStatus, view podView) []v1.PodCondition {
	var out []v1.PodCondition
	for _, c := range pod.Status.Conditions {
		if !kubetypes.PodConditionByKubelet(c.Type) {
			out = append(out, c)
		}
	}
	gen := pod.Generation
	sandbox := v1.PodCondition{Type: v1.PodReadyToStartContainers, Status: v1.ConditionTrue, ObservedGeneration: gen}
	if !view.SandboxReady {
		sandbox.Status, sandbox.Reason = v1.ConditionFalse, kubetypes.PodSandboxNotReadyReason
		sandbox.Message = kubetypes.PodSandboxNotReadyMsgNoPodSandbox
	}
	all := append(append([]v1.ContainerStatus{}, s.InitContainerStatuses...), s.ContainerStatuses...)
	ready := readyCondition(pod, all, s.Phase, out)
	containersReady := containersReadyCondition(pod, all, s.Phase)
	ready.ObservedGeneration, containersReady.ObservedGeneration = gen, gen
	initialized := initializedCondition(pod, all, s.Phase)
	initialized.ObservedGeneration = gen
	scheduled := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionTrue, ObservedGeneration: gen}
	return append(out, sandbox, initialized, ready, containersReady, scheduled)
}

func containersReadyCondition(pod *v1.Pod, all []v1.ContainerStatus, phase v1.PodPhase) v1.PodCondition {
	c := v1.PodCondition{Type: v1.ContainersReady, Status: v1.ConditionFalse}
	switch phase {
	case v1.PodSucceeded:
		c.Reason = "PodCompleted"
		return c
	case v1.PodFailed:
		c.Reason = "PodFailed"
		return c
	}
	var unready []string
	for _, spec := range pod.Spec.InitContainers {
		if podutil.IsRestartableInitContainer(&spec) {
			if st, _ := podutil.GetContainerStatus(all, spec.Name); !st.Ready {
				unready = append(unready, spec.Name)
			}
		}
	}
	for _, spec := range pod.Spec.Containers {
		if st, _ := podutil.GetContainerStatus(all, spec.Name); !st.Ready {
			unready = append(unready, spec.Name)
		}
	}
	if len(unready) > 0 {
		c.Reason = "ContainersNotReady"
		c.Message = fmt.Sprintf("containers with unready status: %s", unready)
		return c
	}
	c.Status = v1.ConditionTrue
	return c
}

func readyCondition(pod *v1.Pod, all []v1.ContainerStatus, phase v1.PodPhase, others []v1.PodCondition) v1.PodCondition {
	cr := containersReadyCondition(pod, all, phase)
	if cr.Status != v1.ConditionTrue {
		return v1.PodCondition{Type: v1.PodReady, Status: cr.Status, Reason: cr.Reason, Message: cr.Message}
	}
	var msgs []string
	for _, rg := range pod.Spec.ReadinessGates {
		_, c := podutil.GetPodConditionFromList(others, rg.ConditionType)
		if c == nil {
			msgs = append(msgs, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", string(rg.ConditionType)))
		} else if c.Status != v1.ConditionTrue {
			msgs = append(msgs, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", string(rg.ConditionType), c.Status))
		}
	}
	if len(msgs) > 0 {
		return v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: "ReadinessGatesNotReady", Message: strings.Join(msgs, ", ")}
	}
	return v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue}
}

func initializedCondition(pod *v1.Pod, all []v1.ContainerStatus, phase v1.PodPhase) v1.PodCondition {
	if phase == v1.PodSucceeded {
		return v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue, Reason: "PodCompleted"}
	}
	if anyRegularStarted(pod, all) {
		return v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue}
	}
	var incomplete []string
	for _, spec := range pod.Spec.InitContainers {
		st, _ := podutil.GetContainerStatus(all, spec.Name)
		done := st.Ready
		if podutil.IsRestartableInitContainer(&spec) {
			done = st.Started != nil && *st.Started
		}
		if !done {
			incomplete = append(incomplete, spec.Name)
		}
	}
	if len(incomplete) > 0 {
		return v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionFalse, Reason: "ContainersNotInitialized",
			Message: fmt.Sprintf("containers with incomplete status: %s", incomplete)}
	}
	return v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue}
}

func anyRegularStarted(pod *v1.Pod, all []v1.ContainerStatus) bool {
	for _, spec := range pod.Spec.Containers {
		st, _ := podutil.GetContainerStatus(all, spec.Name)
		if st.State.Running != nil || st.State.Terminated != nil || st.LastTerminationState.Terminated != nil {
			return true
		}
	}
	return false
}

// transitionTime keeps a condition's lastTransitionTime while its status stays the same.
func transitionTime(old v1.PodStatus, c v1.PodCondition, now time.Time) metav1.Time {
	if _, prev := podutil.GetPodConditionFromList(old.Conditions, c.Type); prev != nil && prev.Status == c.Status && !prev.LastTransitionTime.IsZero() {
		return prev.LastTransitionTime
	}
	return metav1.NewTime(now)
}
