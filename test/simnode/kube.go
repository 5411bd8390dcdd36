package simnode

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Register creates the node's pods in a real API server (their namespaces
// too), adopts the UIDs the server gave them (so cgroup paths and log
// directories match what an informer sees), writes their statuses and syncs.
func (n *Node) Register(ctx context.Context, client kubernetes.Interface) error {
	seen := map[string]bool{}
	for _, obj := range n.PodObjects() {
		if !seen[obj.Namespace] {
			seen[obj.Namespace] = true
			_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: obj.Namespace}}, metav1.CreateOptions{})
			if err != nil && !isAlreadyExists(err) {
				return fmt.Errorf("simnode: namespace %s: %w", obj.Namespace, err)
			}
		}
		create := obj.DeepCopy()
		create.UID = ""
		create.Status = corev1.PodStatus{}
		created, err := client.CoreV1().Pods(obj.Namespace).Create(ctx, create, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("simnode: pod %s/%s: %w", obj.Namespace, obj.Name, err)
		}
		p, err := n.Pod(obj.Namespace, obj.Name)
		if err != nil {
			return err
		}
		n.mu.Lock()
		p.UID = string(created.UID)
		n.mu.Unlock()
	}
	if err := n.Sync(); err != nil {
		return err
	}
	return n.PushStatus(ctx, client)
}

// PushStatus writes every pod's status (container IDs, restarts,
// terminations) to the API server, as the kubelet would.
func (n *Node) PushStatus(ctx context.Context, client kubernetes.Interface) error {
	for _, obj := range n.PodObjects() {
		cur, err := client.CoreV1().Pods(obj.Namespace).Get(ctx, obj.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("simnode: pod %s/%s: %w", obj.Namespace, obj.Name, err)
		}
		cur.Status = obj.Status
		if _, err := client.CoreV1().Pods(obj.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("simnode: status of pod %s/%s: %w", obj.Namespace, obj.Name, err)
		}
	}
	return nil
}

func isAlreadyExists(err error) bool {
	type statusErr interface{ Status() metav1.Status }
	var s statusErr
	if errors.As(err, &s) {
		return s.Status().Reason == metav1.StatusReasonAlreadyExists
	}
	return false
}
