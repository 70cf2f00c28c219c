package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mpsd/mpsd/internal/kubeinfo"
)

// admission evaluates a ValidatingAdmissionPolicy's variables (in order,
// each seeing those before it, as variables.NAME) and validations for an
// object, as the API server does, with CEL's standard library and the
// Kubernetes strings extension; the object is its JSON as a map (the API
// server type-checks against the OpenAPI schema first, which a map does
// not: TestPolicyCompiles keeps the expressions to fields pods have).
type admission struct {
	env         *cel.Env
	variables   []cel.Program
	names       []string
	validations []cel.Program
	messages    []cel.Program
}

func newAdmission(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) *admission {
	t.Helper()
	env, err := cel.NewEnv(
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)),
		ext.Strings(),
	)
	if err != nil {
		t.Fatal(err)
	}
	a := &admission{env: env}
	compile := func(what, expr string) cel.Program {
		t.Helper()
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", what, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return prg
	}
	for _, v := range p.Spec.Variables {
		a.names = append(a.names, v.Name)
		a.variables = append(a.variables, compile("variable "+v.Name, v.Expression))
	}
	for i, v := range p.Spec.Validations {
		a.validations = append(a.validations, compile(fmt.Sprintf("validation %d", i), v.Expression))
		msg := fmt.Sprintf("%q", v.Message)
		if v.MessageExpression != "" {
			msg = v.MessageExpression
		}
		a.messages = append(a.messages, compile(fmt.Sprintf("validation %d's message", i), msg))
	}
	return a
}

// asMap is obj's JSON as CEL sees it: whole numbers as int.
func asMap(t *testing.T, obj any) map[string]any {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	var fix func(any) any
	fix = func(v any) any {
		switch v := v.(type) {
		case json.Number:
			if n, err := v.Int64(); err == nil {
				return n
			}
			f, _ := v.Float64()
			return f
		case map[string]any:
			for k, e := range v {
				v[k] = fix(e)
			}
		case []any:
			for i, e := range v {
				v[i] = fix(e)
			}
		}
		return v
	}
	return fix(m).(map[string]any)
}

// admit returns "" when the policy admits pod, else its message.
func (a *admission) admit(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	vars := map[string]any{}
	in := map[string]any{"object": asMap(t, pod), "oldObject": nil, "variables": vars}
	for i, prg := range a.variables {
		out, _, err := prg.Eval(in)
		if err != nil {
			t.Fatalf("variable %s: %v", a.names[i], err)
		}
		vars[a.names[i]] = out
	}
	for i, prg := range a.validations {
		out, _, err := prg.Eval(in)
		if err != nil {
			t.Fatalf("validation %d: %v", i, err)
		}
		if ok, isBool := out.Value().(bool); !isBool || !ok {
			msg, _, err := a.messages[i].Eval(in)
			if err != nil {
				t.Fatalf("validation %d's message: %v", i, err)
			}
			return fmt.Sprint(msg.Value())
		}
	}
	return ""
}

func examplePolicy(t *testing.T) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	o, problems := decode(readExamples(t))
	if len(problems) > 0 {
		t.Fatalf("examples: %v", problems)
	}
	p := o.policies["mpsd-pods-not-host-root"]
	if p == nil {
		t.Fatal("examples: no ValidatingAdmissionPolicy mpsd-pods-not-host-root")
	}
	return p
}

func ptr[T any](v T) *T { return &v }

// policyPod is a pod of containers, the first asking for units unless
// noUnits, with securityContexts sc (nil for none).
func policyPod(hostUsers *bool, psc *corev1.PodSecurityContext, noUnits bool, sc ...*corev1.SecurityContext) *corev1.Pod {
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "p"}}
	p.Spec.HostUsers, p.Spec.SecurityContext = hostUsers, psc
	for i, s := range sc {
		c := corev1.Container{Name: fmt.Sprintf("c%d", i), Image: "cuda", SecurityContext: s}
		if i == 0 && !noUnits {
			c.Resources.Limits = corev1.ResourceList{"mpsd.io/inference-sm": resource.MustParse("30")}
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// policyCase is a pod the shipped admission policy refuses or admits;
// naming is the container its message names when refused.
// TestPolicyAdmitsWhatTheNodeAllows (the policy's CEL, and the node's
// check) and TestPolicyOnAPIServer (a real API server) judge the same
// cases.
type policyCase struct {
	name    string
	pod     *corev1.Pod
	refused bool
	naming  string
}

// policyCases are fresh pods each call (the tests change them).
func policyCases() []policyCase {
	// Contexts with allowPrivilegeEscalation: false, and without (esc).
	uid := func(v int64) *corev1.SecurityContext {
		return &corev1.SecurityContext{RunAsUser: ptr(v), AllowPrivilegeEscalation: ptr(false)}
	}
	nonRoot := func(v bool) *corev1.SecurityContext {
		return &corev1.SecurityContext{RunAsNonRoot: ptr(v), AllowPrivilegeEscalation: ptr(false)}
	}
	noEsc := &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false)}
	esc := &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(true)}
	withInit := policyPod(nil, &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)}, false, noEsc)
	withInit.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "x", SecurityContext: &corev1.SecurityContext{RunAsUser: ptr(int64(0)), RunAsNonRoot: ptr(false)}}}
	withEph := policyPod(nil, &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000))}, false, noEsc)
	withEph.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "x"}}}
	withEph.Spec.EphemeralContainers[0].SecurityContext = uid(0)
	initUnits := policyPod(nil, nil, true, uid(1000))
	initUnits.Spec.InitContainers = []corev1.Container{{Name: "warmup", Image: "x", SecurityContext: nonRoot(false), Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"mpsd.io/inference-sm": resource.MustParse("1")}}}}
	return []policyCase{
		{"nothing set", policyPod(nil, nil, false, nil), true, "c0"},
		{"runAsUser 0", policyPod(nil, &corev1.PodSecurityContext{RunAsUser: ptr(int64(0))}, false, nil), true, "c0"},
		{"hostUsers true", policyPod(ptr(true), nil, false, uid(0)), true, "c0"},
		{"pod non-root", policyPod(nil, &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)}, false, noEsc, noEsc), false, ""},
		{"pod uid 1000", policyPod(nil, &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000))}, false, noEsc), false, ""},
		{"non-root, privilege escalation unset", policyPod(nil, &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000))}, false, nil), true, "c0"},
		{"non-root, privilege escalation allowed", policyPod(nil, &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)}, false, noEsc, esc), true, "c1"},
		{"a sidecar as root", policyPod(nil, &corev1.PodSecurityContext{RunAsUser: ptr(int64(1000))}, false, noEsc, uid(0)), true, "c1"},
		{"a container not non-root", policyPod(nil, &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)}, false, nonRoot(false)), true, "c0"},
		{"container uid 1000", policyPod(nil, nil, false, uid(1000)), false, ""},
		{"uid 0 under runAsNonRoot", policyPod(nil, &corev1.PodSecurityContext{RunAsUser: ptr(int64(0)), RunAsNonRoot: ptr(true)}, false, noEsc), false, ""},
		{"user namespace", policyPod(ptr(false), nil, false, nil), false, ""},
		{"root init container", withInit, true, "setup"},
		{"root ephemeral container", withEph, true, "debug"},
		{"units on an init container", initUnits, true, "warmup"},
		{"no units, root", policyPod(nil, nil, true, uid(0)), false, ""},
	}
}

// The shipped admission policy refuses exactly the pods mpsd's node check
// refuses (kubeinfo.HostRoot, for pods asking for mpsd.io resources),
// naming the containers that may run as root; pods not asking for mpsd.io
// resources, the example pod and the DaemonSet's pods are admitted.
func TestPolicyAdmitsWhatTheNodeAllows(t *testing.T) {
	a := newAdmission(t, examplePolicy(t))
	for _, tc := range policyCases() {
		msg := a.admit(t, tc.pod)
		b, err := json.Marshal(tc.pod)
		if err != nil {
			t.Fatal(err)
		}
		pod, err := kubeinfo.DecodePod(b) // as the API server sends it to the node's check
		if err != nil {
			t.Fatal(err)
		}
		node := kubeinfo.AsksMPSD(pod) && kubeinfo.HostRoot(pod) != nil
		switch {
		case tc.refused != (msg != ""):
			t.Errorf("%s: policy says %q; want refused %v", tc.name, msg, tc.refused)
		case node != tc.refused:
			t.Errorf("%s: the node's check refuses %v, the policy %v: they disagree", tc.name, node, tc.refused)
		case tc.refused && (!strings.Contains(msg, "container(s) "+tc.naming+" may run as host root") || !strings.Contains(msg, "hostUsers: false")):
			t.Errorf("%s: message %q does not name %s and the fix", tc.name, msg, tc.naming)
		}
	}
	o, _ := decode(readExamples(t))
	for _, p := range o.pods {
		if msg := a.admit(t, p); msg != "" {
			t.Errorf("the example pod %s is refused: %s", p.Name, msg)
		}
	}
	for _, ds := range o.daemonSets {
		p := &corev1.Pod{ObjectMeta: ds.Spec.Template.ObjectMeta, Spec: ds.Spec.Template.Spec}
		if msg := a.admit(t, p); msg != "" {
			t.Errorf("DaemonSet %s's pods are refused: %s", ds.Name, msg)
		}
	}
}

// The policy's expressions compile, and read only fields a Pod has: each
// path object.spec.X... it names is a field of the Pod's JSON.
func TestPolicyCompiles(t *testing.T) {
	p := examplePolicy(t)
	newAdmission(t, p)
	known := map[string]bool{
		"spec.containers": true, "spec.initContainers": true, "spec.ephemeralContainers": true, "spec.hostUsers": true,
		"spec.securityContext": true, "spec.securityContext.runAsNonRoot": true, "spec.securityContext.runAsUser": true,
	}
	full := policyPod(ptr(false), &corev1.PodSecurityContext{RunAsUser: ptr(int64(1)), RunAsNonRoot: ptr(true)}, false, uid1())
	full.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr(false)
	full.Spec.InitContainers = full.Spec.Containers
	full.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "e"}}}
	m := asMap(t, full)
	for path := range known {
		var cur any = m
		for _, f := range strings.Split(path, ".") {
			mm, ok := cur.(map[string]any)
			if !ok || mm[f] == nil {
				t.Errorf("a Pod's JSON has no %s", path)
				break
			}
			cur = mm[f]
		}
	}
	var exprs []string
	for _, v := range p.Spec.Variables {
		exprs = append(exprs, v.Expression)
	}
	for _, v := range p.Spec.Validations {
		exprs = append(exprs, v.Expression, v.MessageExpression)
	}
	for _, e := range exprs {
		for _, part := range strings.Split(e, "object.")[1:] {
			end := strings.IndexFunc(part, func(r rune) bool { return r != '.' && r != '_' && !('a' <= r && r <= 'z') && !('A' <= r && r <= 'Z') })
			if end < 0 {
				end = len(part)
			}
			if path := strings.TrimSuffix(part[:end], "."); !known[path] {
				t.Errorf("expression reads object.%s, which this test does not know a Pod to have", path)
			}
		}
	}
	// Containers' fields it reads.
	c := asMap(t, corev1.Container{Name: "c", SecurityContext: &corev1.SecurityContext{RunAsUser: ptr(int64(1)), RunAsNonRoot: ptr(true), AllowPrivilegeEscalation: ptr(false)},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"x": resource.MustParse("1")}, Requests: corev1.ResourceList{"x": resource.MustParse("1")}}})
	for _, f := range []string{"name", "securityContext", "resources"} {
		if c[f] == nil {
			t.Errorf("a Container's JSON has no %s", f)
		}
	}
	for _, f := range []string{"runAsUser", "runAsNonRoot", "allowPrivilegeEscalation"} {
		if c["securityContext"].(map[string]any)[f] == nil {
			t.Errorf("a Container's securityContext has no %s", f)
		}
	}
	for _, f := range []string{"limits", "requests"} {
		if c["resources"].(map[string]any)[f] == nil {
			t.Errorf("a Container's resources have no %s", f)
		}
	}
}

func uid1() *corev1.SecurityContext { return &corev1.SecurityContext{RunAsUser: ptr(int64(1))} }
