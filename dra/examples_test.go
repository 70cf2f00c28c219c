package dra

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"sigs.k8s.io/yaml"

	"github.com/mpsd/mpsd/api"
)

// examplesDir holds the DRA examples of docs/cluster.md.
const examplesDir = "../examples/kubernetes/dra"

// The examples decode strictly into the k8s.io/api types; the
// DeviceClass's selector compiles as the API server compiles it and
// selects the devices the driver publishes for its group only; the
// claim template asks for sm 30 and memory 8Gi within the published
// requestPolicy; the pod uses the template's claim.
func TestExamples(t *testing.T) {
	var (
		classes   []resourceapi.DeviceClass
		templates []resourceapi.ResourceClaimTemplate
		pods      []corev1.Pod
	)
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in %s: %v", examplesDir, err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			var head struct{ Kind string }
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatalf("%s document %d: %v", file, i, err)
			}
			var obj any
			switch head.Kind {
			case "DeviceClass":
				classes = append(classes, resourceapi.DeviceClass{})
				obj = &classes[len(classes)-1]
			case "ResourceClaimTemplate":
				templates = append(templates, resourceapi.ResourceClaimTemplate{})
				obj = &templates[len(templates)-1]
			case "Pod":
				pods = append(pods, corev1.Pod{})
				obj = &pods[len(pods)-1]
			case "ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			default:
				t.Fatalf("%s document %d: kind %q not checked", file, i, head.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s document %d (%s): %v", file, i, head.Kind, err)
			}
		}
	}
	if len(classes) != 1 || len(templates) != 1 || len(pods) != 1 {
		t.Fatalf("%d classes, %d templates, %d pods; want one of each", len(classes), len(templates), len(pods))
	}

	class := classes[0]
	st := api.Status{Instances: []api.InstanceStatus{instance("inference", 0), instance("training", 0)}}
	devs := Devices(st, testLimits, Consumable, nil)
	if len(class.Spec.Selectors) != 1 || class.Spec.Selectors[0].CEL == nil {
		t.Fatalf("class %s: want one CEL selector", class.Name)
	}
	expr := class.Spec.Selectors[0].CEL.Expression
	compiled := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).CompileCELExpression(expr, dracel.Options{})
	if compiled.Error != nil {
		t.Fatalf("class %s: selector %q: %v", class.Name, expr, compiled.Error)
	}
	for _, d := range devs {
		match, _, err := compiled.DeviceMatches(context.Background(), dracel.Device{Driver: DriverName, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations})
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.HasPrefix(d.Name, "inference-"); match != want {
			t.Errorf("class %s selects device %s: %v, want %v", class.Name, d.Name, match, want)
		}
	}

	tmpl := templates[0]
	reqs := tmpl.Spec.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != class.Name || reqs[0].Exactly.Capacity == nil {
		t.Fatalf("template %s: requests %+v, want one of class %s with capacity", tmpl.Name, reqs, class.Name)
	}
	got := reqs[0].Exactly.Capacity.Requests
	for name, want := range map[resourceapi.QualifiedName]resource.Quantity{CapacitySM: resource.MustParse("30"), CapacityMemory: resource.MustParse("8Gi")} {
		q, ok := got[name]
		if !ok || q.Cmp(want) != 0 {
			t.Errorf("template %s asks %s %v, want %v", tmpl.Name, name, got[name], want.String())
		}
		rp := devs[0].Capacity[name].RequestPolicy
		if q.Cmp(*rp.ValidRange.Min) < 0 || q.Cmp(*rp.ValidRange.Max) > 0 {
			t.Errorf("template %s asks %s %v, outside the device's range %v to %v", tmpl.Name, name, q.String(), rp.ValidRange.Min, rp.ValidRange.Max)
		}
	}
	for _, name := range []string{class.Name, tmpl.Name, reqs[0].Name} {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("name %q: %v", name, errs)
		}
	}

	pod := pods[0]
	if len(pod.Spec.ResourceClaims) != 1 || pod.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil || *pod.Spec.ResourceClaims[0].ResourceClaimTemplateName != tmpl.Name {
		t.Fatalf("pod %s: claims %+v, want one from template %s", pod.Name, pod.Spec.ResourceClaims, tmpl.Name)
	}
	for _, c := range pod.Spec.Containers {
		if len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != pod.Spec.ResourceClaims[0].Name {
			t.Errorf("pod %s container %s: claims %+v, want the pod's claim", pod.Name, c.Name, c.Resources.Claims)
		}
	}
}
