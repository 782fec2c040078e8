// A small chat client for the browser: it talks to this server's /v1/chat/completions with
// stream=true, shows the reply as it streams, the reasoning folded in a <details>, a stop button
// (aborts the fetch, which cancels the sequence on the server), the model name and tokens/s.
#include "server/chat_page.h"

namespace anvil::server {

const std::string& chat_page_html() {
  static const std::string kPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>anvil</title>
<style>
body{font-family:system-ui,sans-serif;max-width:52rem;margin:0 auto;padding:1rem;background:#fafafa;color:#222}
header{display:flex;gap:1rem;align-items:baseline;border-bottom:1px solid #ddd;padding-bottom:.5rem}
#model{font-weight:600}#stats{color:#666;font-size:.9rem;margin-left:auto}
#log{margin:1rem 0}.msg{padding:.6rem .8rem;margin:.5rem 0;border-radius:.4rem;white-space:pre-wrap}
.user{background:#e8f0fe}.assistant{background:#fff;border:1px solid #e3e3e3}
details{color:#666;font-size:.9rem;margin-bottom:.4rem}.error{color:#b00020}
form{display:flex;gap:.5rem}textarea{flex:1;min-height:3rem;font:inherit;padding:.4rem}
button{font:inherit;padding:.4rem 1rem}
</style></head><body>
<header><span>anvil</span><span id="model">…</span><span id="stats"></span></header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
<button id="send" type="submit">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<p><label>API key <input id="key" type="password" size="24"></label></p>
<script>
const $=id=>document.getElementById(id);
let messages=[],ctrl=null,opts={};
function headers(){const h={'Content-Type':'application/json'};const k=$('key').value;if(k)h['Authorization']='Bearer '+k;return h}
async function loadModel(){try{const r=await fetch('/v1/models',{headers:headers()});const j=await r.json();
  $('model').textContent=j.data?j.data[0].id:(j.error?j.error.message:'?')}catch(e){$('model').textContent='?'}}
function bubble(role){const d=document.createElement('div');d.className='msg '+role;$('log').appendChild(d);return d}
async function send(text){
  messages.push({role:'user',content:text});bubble('user').textContent=text;
  const box=bubble('assistant');const det=document.createElement('details');const sum=document.createElement('summary');
  sum.textContent='reasoning';const reas=document.createElement('div');det.appendChild(sum);det.appendChild(reas);
  const content=document.createElement('div');content.className='content';box.appendChild(content);
  ctrl=new AbortController();$('stop').disabled=false;$('send').disabled=true;
  let answer='',n=0,t0=0;
  try{
    const r=await fetch('/v1/chat/completions',{method:'POST',headers:headers(),signal:ctrl.signal,
      body:JSON.stringify(Object.assign({messages,stream:true,stream_options:{include_usage:true}},opts))});
    if(!r.ok){const j=await r.json();throw new Error(j.error?j.error.message:r.statusText)}
    const rd=r.body.getReader();const dec=new TextDecoder();let buf='';
    for(;;){const {value,done}=await rd.read();if(done)break;buf+=dec.decode(value,{stream:true});
      let i;while((i=buf.indexOf('\n\n'))>=0){const line=buf.slice(0,i);buf=buf.slice(i+2);
        if(!line.startsWith('data: '))continue;const data=line.slice(6);if(data==='[DONE]')continue;
        const j=JSON.parse(data);if(j.error)throw new Error(j.error.message);
        if(j.usage){$('stats').textContent=j.usage.completion_tokens+' tokens, '+
          (t0&&n>1?((n-1)/((performance.now()-t0)/1000)).toFixed(1):'-')+' tok/s';continue}
        const d=j.choices[0].delta||{};
        if(d.reasoning_content){if(!det.parentNode)box.insertBefore(det,content);reas.textContent+=d.reasoning_content}
        if(d.content){answer+=d.content;content.textContent=answer}
        if(d.reasoning_content||d.content){n++;if(!t0)t0=performance.now()}}}
  }catch(e){if(e.name!=='AbortError'){const er=document.createElement('div');er.className='error';er.textContent=e.message;box.appendChild(er)}}
  messages.push({role:'assistant',content:answer});ctrl=null;$('stop').disabled=true;$('send').disabled=false;
  box.dataset.done='1'}
$('form').onsubmit=e=>{e.preventDefault();const t=$('input').value.trim();if(!t||ctrl)return;$('input').value='';send(t)};
$('input').onkeydown=e=>{if(e.key==='Enter'&&!e.shiftKey){e.preventDefault();$('form').requestSubmit()}};
$('stop').onclick=()=>{if(ctrl)ctrl.abort()};
$('key').onchange=loadModel;
// A link can start a conversation: /#send=TEXT[&max_tokens=N][&key=KEY] (also what the browser test uses).
const h=new URLSearchParams(location.hash.slice(1));
if(h.get('key'))$('key').value=h.get('key');
if(h.get('max_tokens'))opts.max_tokens=parseInt(h.get('max_tokens'));
loadModel();if(h.get('send'))send(h.get('send'));
</script></body></html>
)HTML";
  return kPage;
}

}  // namespace anvil::server
