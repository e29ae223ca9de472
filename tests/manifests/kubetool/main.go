// Command kubetool gives the manifest tests the real Kubernetes code for three
// jobs, so that they do not depend on a kubectl binary being installed:
//
//	kubetool kustomize DIR      prints `kustomize build DIR` (sigs.k8s.io/kustomize/api)
//	kubetool matchconditions    evaluates webhook matchConditions (JSON on stdin)
//	kubetool policy             evaluates a ValidatingAdmissionPolicy (JSON on stdin)
//
// matchconditions uses the API server's own code (k8s.io/apiserver: the CEL
// environment, compiler and matcher that kube-apiserver runs), so that tests
// can check that cel-python classifies the same objects the same way.
//
// Its input on stdin (JSON):
//
//	{"hooks": [{"name": "...", "conditions": [{"name": "...", "expression": "..."}],
//	            "cases": [{"operation": "CREATE|UPDATE|DELETE", "resource": "pods|configmaps|resourceclaims|resourceclaimtemplates",
//	                       "object": {...}|null, "oldObject": {...}|null}]}]}
//
// Output on stdout (JSON), per hook: the errors of the strict compile that the
// API server runs when a webhook configuration is created, and per case
// whether the webhook would be called ("matches"), the first condition that
// was false, or the evaluation error (which failurePolicy Fail turns into a
// refusal).
//
// policy compiles a ValidatingAdmissionPolicy as the API server does (the
// strict compile of a new policy, then the validator its admission plugin
// builds: variables, matchConditions, validations, messageExpressions) and
// evaluates it on pod requests. Input on stdin (JSON):
//
//	{"policy": {...ValidatingAdmissionPolicy...},
//	 "cases": [{"operation": "UPDATE", "subResource": ""|"status"|...,
//	            "user": "...", "groups": ["..."], "object": {...}, "oldObject": {...}}]}
//
// Output on stdout (JSON): the strict compile's errors, and per case the
// decisions (action admit|deny, evaluation admit|deny|error, message, reason);
// no decisions when the matchConditions exclude the request.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

type condition struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}

type testCase struct {
	Operation string          `json:"operation"`
	Resource  string          `json:"resource"`
	Object    json.RawMessage `json:"object"`
	OldObject json.RawMessage `json:"oldObject"`
}

type hook struct {
	Name       string      `json:"name"`
	Conditions []condition `json:"conditions"`
	Cases      []testCase  `json:"cases"`
}

type result struct {
	Matches         bool   `json:"matches"`
	FailedCondition string `json:"failedCondition"`
	Error           string `json:"error"`
}

type hookResult struct {
	Name          string   `json:"name"`
	CompileErrors []string `json:"compileErrors"`
	Results       []result `json:"results"`
}

// decode turns a case's JSON into the typed object the API server would hold
// (nil for JSON null or absent).
func decode(raw json.RawMessage, resource string) (runtime.Object, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var obj runtime.Object
	switch resource {
	case "pods":
		obj = &corev1.Pod{}
	case "configmaps":
		obj = &corev1.ConfigMap{}
	case "resourceclaims":
		obj = &resourcev1.ResourceClaim{}
	case "resourceclaimtemplates":
		obj = &resourcev1.ResourceClaimTemplate{}
	default:
		return nil, fmt.Errorf("unknown resource %q (use pods, configmaps, resourceclaims "+
			"or resourceclaimtemplates)", resource)
	}
	if err := json.Unmarshal(raw, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

func gvkFor(resource string) schema.GroupVersionKind {
	switch resource {
	case "pods":
		return schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	case "resourceclaims":
		return schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"}
	case "resourceclaimtemplates":
		return schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1",
			Kind: "ResourceClaimTemplate"}
	}
	return schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
}

func run(h hook) (hookResult, error) {
	out := hookResult{Name: h.Name, CompileErrors: []string{}, Results: []result{}}
	envSet := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
	vars := plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: true}

	// What the API server's validation runs on a new webhook configuration.
	strict := plugincel.NewCompiler(envSet)
	accessors := make([]plugincel.ExpressionAccessor, len(h.Conditions))
	for i, c := range h.Conditions {
		mc := &matchconditions.MatchCondition{Name: c.Name, Expression: c.Expression}
		accessors[i] = mc
		res := strict.CompileCELExpression(mc, vars, environment.NewExpressions)
		if res.Error != nil {
			out.CompileErrors = append(out.CompileErrors, fmt.Sprintf("%s: %v", c.Name, res.Error))
		}
	}

	// What the webhook admission plugin runs on every request.
	evaluator := plugincel.NewConditionCompiler(envSet).CompileCondition(accessors, vars, environment.StoredExpressions)
	fail := admissionregistrationv1.Fail
	matcher := matchconditions.NewMatcher(evaluator, &fail, "webhook", "admit", h.Name)
	authz := authorizerfactory.NewAlwaysAllowAuthorizer()

	for _, tc := range h.Cases {
		obj, err := decode(tc.Object, tc.Resource)
		if err != nil {
			return out, err
		}
		old, err := decode(tc.OldObject, tc.Resource)
		if err != nil {
			return out, err
		}
		gvk := gvkFor(tc.Resource)
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: "v1", Resource: tc.Resource}
		attr := admission.NewAttributesRecord(obj, old, gvk, "team-a-dev", "", gvr, "",
			admission.Operation(tc.Operation), nil, false, &user.DefaultInfo{Name: "alice"})
		versioned := &admission.VersionedAttributes{
			Attributes: attr, VersionedKind: gvk, VersionedObject: obj, VersionedOldObject: old,
		}
		m := matcher.Match(context.Background(), versioned, nil, authz)
		r := result{Matches: m.Matches, FailedCondition: m.FailedConditionName}
		if m.Error != nil {
			r.Error = m.Error.Error()
		}
		out.Results = append(out.Results, r)
	}
	return out, nil
}

func matchConditions() error {
	var in struct {
		Hooks []hook `json:"hooks"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		return fmt.Errorf("cannot parse input: %w", err)
	}
	results := make([]hookResult, 0, len(in.Hooks))
	for _, h := range in.Hooks {
		r, err := run(h)
		if err != nil {
			return fmt.Errorf("hook %s: %w", h.Name, err)
		}
		results = append(results, r)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"hooks": results})
}

func kustomize(dir string) error {
	// Legacy (kind) order, as `kubectl kustomize` prints it: Namespace, RBAC and
	// config first, the webhook configurations last.
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy
	k := krusty.MakeKustomizer(opts)
	resources, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return err
	}
	out, err := resources.AsYaml()
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}

type policyCase struct {
	Operation   string          `json:"operation"`
	SubResource string          `json:"subResource"`
	User        string          `json:"user"`
	Groups      []string        `json:"groups"`
	Object      json.RawMessage `json:"object"`
	OldObject   json.RawMessage `json:"oldObject"`
}

type decision struct {
	Action     string `json:"action"`
	Evaluation string `json:"evaluation"`
	Message    string `json:"message"`
	Reason     string `json:"reason"`
}

var policyOptions = plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: true}

// strictCompileErrors compiles every expression of spec the way the API server
// validates a new policy (environment.NewExpressions) and returns the errors.
func strictCompileErrors(spec admissionregistrationv1.ValidatingAdmissionPolicySpec) ([]string, error) {
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, err
	}
	errs := []string{}
	check := func(what string, res plugincel.CompilationResult) {
		if res.Error != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", what, res.Error))
		}
	}
	for _, v := range spec.Variables {
		check("variable "+v.Name, compiler.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, policyOptions, environment.NewExpressions))
	}
	for i, mc := range spec.MatchConditions {
		check("matchCondition "+mc.Name, compiler.CompileCELExpression((*matchconditions.MatchCondition)(&spec.MatchConditions[i]), policyOptions, environment.NewExpressions))
	}
	noAuthz := plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: false}
	for i, v := range spec.Validations {
		check(fmt.Sprintf("validation %d", i), compiler.CompileCELExpression(&validating.ValidationCondition{Expression: v.Expression}, policyOptions, environment.NewExpressions))
		if v.MessageExpression != "" {
			check(fmt.Sprintf("messageExpression %d", i), compiler.CompileCELExpression(&validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}, noAuthz, environment.NewExpressions))
		}
	}
	return errs, nil
}

// compilePolicy is the validating admission plugin's compilePolicy
// (k8s.io/apiserver/pkg/admission/plugin/policy/validating), which is unexported.
func compilePolicy(policy *admissionregistrationv1.ValidatingAdmissionPolicy) (validating.Validator, error) {
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, err
	}
	spec := policy.Spec
	variables := make([]plugincel.NamedExpressionAccessor, len(spec.Variables))
	for i, v := range spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, policyOptions, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if len(spec.MatchConditions) > 0 {
		accessors := make([]plugincel.ExpressionAccessor, len(spec.MatchConditions))
		for i := range spec.MatchConditions {
			accessors[i] = (*matchconditions.MatchCondition)(&spec.MatchConditions[i])
		}
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(accessors, policyOptions, environment.StoredExpressions), spec.FailurePolicy, "policy", "validate", policy.Name)
	}
	validations := make([]plugincel.ExpressionAccessor, len(spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(spec.Validations))
	for i, v := range spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	noAuthz := plugincel.OptionalVariableDeclarations{HasParams: false, HasAuthorizer: false}
	return validating.NewValidator(
		compiler.CompileCondition(validations, policyOptions, environment.StoredExpressions),
		matcher,
		compiler.CompileCondition(nil, policyOptions, environment.StoredExpressions),
		compiler.CompileCondition(messages, noAuthz, environment.StoredExpressions),
		spec.FailurePolicy,
		nil,
	), nil
}

func policy() error {
	var in struct {
		Policy admissionregistrationv1.ValidatingAdmissionPolicy `json:"policy"`
		Cases  []policyCase                                      `json:"cases"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		return fmt.Errorf("cannot parse input: %w", err)
	}
	compileErrors, err := strictCompileErrors(in.Policy.Spec)
	if err != nil {
		return err
	}
	validator, err := compilePolicy(&in.Policy)
	if err != nil {
		return err
	}
	gvk := gvkFor("pods")
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	results := make([][]decision, 0, len(in.Cases))
	for _, tc := range in.Cases {
		obj, err := decode(tc.Object, "pods")
		if err != nil {
			return err
		}
		old, err := decode(tc.OldObject, "pods")
		if err != nil {
			return err
		}
		attr := admission.NewAttributesRecord(obj, old, gvk, "team-a-dev", "p", gvr, tc.SubResource,
			admission.Operation(tc.Operation), nil, false, &user.DefaultInfo{Name: tc.User, Groups: tc.Groups})
		versioned := &admission.VersionedAttributes{
			Attributes: attr, VersionedKind: gvk, VersionedObject: obj, VersionedOldObject: old,
		}
		namespace := &corev1.Namespace{}
		namespace.Name = "team-a-dev"
		res := validator.Validate(context.Background(), gvr, versioned, nil, namespace,
			celconfig.RuntimeCELCostBudget, authorizerfactory.NewAlwaysAllowAuthorizer())
		decisions := make([]decision, 0, len(res.Decisions))
		for _, d := range res.Decisions {
			decisions = append(decisions, decision{
				Action: string(d.Action), Evaluation: string(d.Evaluation),
				Message: d.Message, Reason: string(d.Reason),
			})
		}
		results = append(results, decisions)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"compileErrors": compileErrors, "results": results,
	})
}

const usage = "usage: kubetool kustomize DIR | kubetool matchconditions < input.json | kubetool policy < input.json"

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "kustomize":
		err = kustomize(os.Args[2])
	case len(os.Args) == 2 && os.Args[1] == "matchconditions":
		err = matchConditions()
	case len(os.Args) == 2 && os.Args[1] == "policy":
		err = policy()
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubetool: %v\n", err)
		os.Exit(1)
	}
}
