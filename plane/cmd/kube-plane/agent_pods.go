package main

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Pods reach the agent through one informer per node, each with the field selector
// spec.nodeName=<node> (the only list the Node authorizer allows a node), and go to one
// worker per Pod UID.

type podRegistry struct {
	mu       sync.Mutex
	workers  map[types.UID]*podWorker
	finished map[types.UID]bool // workers done whose Pod the informer still has
}

func (n *nodeAgent) podInformer() cache.SharedIndexInformer {
	factory := informers.NewSharedInformerFactoryWithOptions(n.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + n.name }))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.a.podChanged(n, obj.(*v1.Pod)) },
		UpdateFunc: func(_, obj any) { n.a.podChanged(n, obj.(*v1.Pod)) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				n.a.podRemoved(pod)
			}
		},
	})
	return inf
}

func (a *agent) podChanged(n *nodeAgent, pod *v1.Pod) {
	a.pods.mu.Lock()
	w := a.pods.workers[pod.UID]
	if w == nil {
		if a.pods.finished[pod.UID] || a.isStopping() {
			a.pods.mu.Unlock()
			return
		}
		w = newPodWorker(a, n, pod)
		a.pods.workers[pod.UID] = w
		go w.run()
	}
	a.pods.mu.Unlock()
	w.update(pod)
}

func (a *agent) podRemoved(pod *v1.Pod) {
	a.pods.mu.Lock()
	w := a.pods.workers[pod.UID]
	delete(a.pods.finished, pod.UID)
	a.pods.mu.Unlock()
	if w != nil {
		w.markGone()
	}
}

func (a *agent) workerDone(w *podWorker) {
	a.pods.mu.Lock()
	defer a.pods.mu.Unlock()
	delete(a.pods.workers, w.uid)
	a.pods.finished[w.uid] = true
}

func (a *agent) workerList() []*podWorker {
	a.pods.mu.Lock()
	defer a.pods.mu.Unlock()
	out := make([]*podWorker, 0, len(a.pods.workers))
	for _, w := range a.pods.workers {
		out = append(out, w)
	}
	return out
}

// findWorker finds a Pod by namespace and name, whichever node it is on.
func (a *agent) findWorker(ns, name string) *podWorker {
	for _, w := range a.workerList() {
		if pod, gone := w.current(); !gone && pod.Namespace == ns && pod.Name == name {
			return w
		}
	}
	return nil
}

// podsInNamespace lists the Pods of every node in ns, from the informers' caches.
func (a *agent) podsInNamespace(ns string) []*v1.Pod {
	var out []*v1.Pod
	for _, inf := range a.podInformers {
		objs, _ := inf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
		for _, o := range objs {
			out = append(out, o.(*v1.Pod))
		}
	}
	return out
}

func (w *podWorker) runByID(id string) *containerRun {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runs[id]
}

// runningRun is the run of a container that runs now, as last reported.
func (w *podWorker) runningRun(name string) *containerRun {
	_, st := w.snapshot()
	if st == nil {
		return nil
	}
	for _, cs := range append(append([]v1.ContainerStatus{}, st.ContainerStatuses...), st.InitContainerStatuses...) {
		if cs.Name == name && cs.State.Running != nil {
			return w.runByID(cs.ContainerID)
		}
	}
	return nil
}
